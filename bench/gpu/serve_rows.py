"""The rows of a GPU script's `vllm bench serve` runs (bench/gpu/serve_bench.sh): one per result file
bench-TARGET-cN.json, with the gateway's CPU seconds its log line gave (targets named gateway*).

    python3 -m bench.gpu.serve_rows RESULTS_DIR LOG OUT_JSON [KEY=VALUE ...]   (KEY=VALUE: fields of every row)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

LINE = re.compile(r"^(\S+ c=\d+) n=\d+ rc=\d+ gateway_cpu_s=(\S+)", re.M)


def rows(results: Path, log: Path, extra: dict[str, object]) -> list[dict]:
    cpu = {m[1]: float(m[2]) for m in LINE.finditer(log.read_text())}
    out = []
    for f in sorted(results.glob("bench-*-c*.json")):
        d = json.loads(f.read_text())
        target, c = re.match(r"bench-(.+)-c(\d+)\.json", f.name).groups()  # type: ignore[union-attr]
        gw_cpu = cpu.get(f"{target} c={c}") if target.startswith("gateway") else None
        tokens = d.get("total_output_tokens") or 0
        per_1k = round(gw_cpu / tokens * 1000, 4) if gw_cpu and tokens else None
        out.append({"target": target, "concurrency": int(c), **extra,
                    "req_s": round(d["request_throughput"], 2), "out_tok_s": round(d["output_throughput"], 1),
                    "ttft_p50_ms": round(d.get("p50_ttft_ms", d.get("median_ttft_ms", -1)), 1),
                    "ttft_p99_ms": round(d["p99_ttft_ms"], 1),
                    "tpot_p50_ms": round(d.get("p50_tpot_ms", d.get("median_tpot_ms", -1)), 2),
                    "gateway_cpu_s": gw_cpu,
                    "gateway_cpu_s_per_1k_tokens": per_1k})  # fmt: skip
    return sorted(out, key=lambda r: (r["concurrency"], r["target"]))


def main(argv: list[str]) -> int:
    results, log, out_json, *pairs = argv
    extra = {k: int(v) if v.isdigit() else v for k, v in (p.split("=", 1) for p in pairs)}
    found = rows(Path(results), Path(log), extra)
    Path(out_json).write_text(json.dumps(found, indent=1) + "\n")
    for r in found:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
