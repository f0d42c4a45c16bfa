"""The rows of a GPU script's `vllm bench serve` runs (bench/gpu/serve_bench.sh): one per result file
bench-TARGET-cN.json, with the CPU seconds its log line gave: the gateway's (targets named gateway*), the client's
and the engine's API server's, and the SSE chunks per request (from a result file saved with --save-detailed).

    python3 -m bench.gpu.serve_rows RESULTS_DIR LOG OUT_JSON [KEY=VALUE ...]   (KEY=VALUE: fields of every row)
    python3 -m bench.gpu.serve_rows --merge OUT_JSON PART_JSON...   one run's result from its clients' files

A run split across several clients (BENCH_CLIENTS) is merged as one client would have reported it: requests and
tokens summed over the longest client's duration (the clients start together, so this errs low by their start
skew), TTFT and TPOT percentiles over every client's requests (linear interpolation, as numpy's and vLLM's).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from stack.load.summary import percentile  # numpy's linear interpolation, as vLLM's bench

LINE = re.compile(r"^(\S+ c=\d+) n=\d+(?: clients=\d+)? rc=\d+ gateway_cpu_s=(\S+)(.*)$", re.M)
MORE = re.compile(  # added later
    r"(client_cpu_s|engine_api_cpu_s|to_engine_p50_ms|to_engine_p99_ms|to_engine_mean_ms|engine_ttft_p50_ms"
    r"|engine_ttft_p99_ms|engine_ttft_mean_ms)=([0-9.]+)"
)


def rows(results: Path, log: Path, extra: dict[str, object]) -> list[dict]:
    lines = {m[1]: m for m in LINE.finditer(log.read_text())}
    out = []
    for f in sorted(results.glob("bench-*-c*.json")):
        d = json.loads(f.read_text())
        target, c = re.match(r"bench-(.+)-c(\d+)\.json", f.name).groups()  # type: ignore[union-attr]
        line = lines.get(f"{target} c={c}")
        gw_cpu = float(line[2]) if line is not None and target.startswith("gateway") else None
        tokens = d.get("total_output_tokens") or 0
        per_1k = round(gw_cpu / tokens * 1000, 4) if gw_cpu and tokens else None
        more = {k: float(v) for k, v in MORE.findall(line[3])} if line is not None else {}
        itls = d.get("itls") or []
        chunks = round(sum(len(i) + 1 for i in itls) / len(itls), 1) if itls else None
        out.append({"target": target, "concurrency": int(c), **extra,
                    "req_s": round(d["request_throughput"], 2), "out_tok_s": round(d["output_throughput"], 1),
                    "ttft_p50_ms": round(d.get("p50_ttft_ms", d.get("median_ttft_ms", -1)), 1),
                    "ttft_p99_ms": round(d["p99_ttft_ms"], 1),
                    # the mean, beside the engine's own (engine_ttft_mean_ms): their difference is the time outside
                    # the engine (its HTTP front, a gateway, the client), free of the engine's own run-to-run spread
                    "ttft_mean_ms": round(d["mean_ttft_ms"], 1) if "mean_ttft_ms" in d else None,
                    "tpot_p50_ms": round(d.get("p50_tpot_ms", d.get("median_tpot_ms", -1)), 2),
                    "gateway_cpu_s": gw_cpu,
                    "gateway_cpu_s_per_1k_tokens": per_1k, **more, "chunks_per_request": chunks})  # fmt: skip
    return sorted(out, key=lambda r: (r["concurrency"], r["target"]))


def merge(parts: list[dict]) -> dict:
    """One result file from the clients' own (saved with --save-detailed)."""
    duration = max(p["duration"] for p in parts)
    done = [
        (ttft, itl, n)
        for p in parts
        for ttft, itl, n, error in zip(p["ttfts"], p["itls"], p["output_lens"], p["errors"], strict=True)
        if not error and n > 0
    ]
    if not done:
        raise ValueError("no client finished a request")
    ttfts = [ttft * 1000 for ttft, _, _ in done]
    tpots = [sum(itl) * 1000 / (n - 1) for _, itl, n in done if n > 1] or [0.0]
    completed = sum(p["completed"] for p in parts)
    tokens = sum(p["total_output_tokens"] for p in parts)
    return {
        "duration": duration,
        "clients": len(parts),
        "client_durations": [p["duration"] for p in parts],
        "completed": completed,
        "total_output_tokens": tokens,
        "request_throughput": completed / duration,
        "output_throughput": tokens / duration,
        "mean_ttft_ms": sum(ttfts) / len(ttfts),
        "median_ttft_ms": percentile(ttfts, 50),
        "p99_ttft_ms": percentile(ttfts, 99),
        "median_tpot_ms": percentile(tpots, 50),
        "p99_tpot_ms": percentile(tpots, 99),
        "ttfts": [ttft for ttft, _, _ in done],
        "itls": [itl for _, itl, _ in done],
        "output_lens": [n for *_, n in done],
    }


def main(argv: list[str]) -> int:
    if argv[:1] == ["--merge"]:
        out_json, *part_files = argv[1:]
        merged = merge([json.loads(Path(f).read_text()) for f in part_files])
        Path(out_json).write_text(json.dumps(merged) + "\n")
        rate = merged["output_throughput"]
        print(f"merged {len(part_files)} clients: {merged['completed']} requests, {rate:.0f} tok/s")
        return 0
    results, log, out_json, *pairs = argv
    extra = {k: int(v) if v.isdigit() else v for k, v in (p.split("=", 1) for p in pairs)}
    found = rows(Path(results), Path(log), extra)
    Path(out_json).write_text(json.dumps(found, indent=1) + "\n")
    for r in found:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
