"""What the stack adds to a start, without an engine's own minute: `vstack up` to the first streamed token with a
stand-in engine (the local OpenAI-compatible stand-in, bench/harness/mock_upstream.py, started by a wrapper set
as `engine_python` after a 2 s pause), against the stand-in started alone, for two checkouts side by side in
interleaved rounds.

    .venv/bin/python bench/startup_overhead.py --trees ../old,. --rounds 3

`added` = a tree's median minus the stand-in's own median: the CLI, the configuration, the plan, the gateway
process, its imports before the engine is spawned, and how soon readiness is seen. Light (no vLLM engine):
it needs no engine lock, and says nothing of vLLM's own start (bench/startup_time.py measures that).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRAPPER = """#!/bin/bash
if [ "$1" = "-m" ] && { [ "$2" = "stack.vllm.launcher" ] || [ "$3" = "stack.vllm.launcher" ]; }; then
  port=""; prev=""
  for a in "$@"; do [ "$prev" = "--port" ] && port=$a; prev=$a; done
  sleep 2
  exec {py} {mock} --port "$port" --chunks 5
fi
exec {py} "$@"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for bench.harness
from bench.harness.waiting import first_token as _first_token  # noqa: E402


def first_token(url: str, model: str, deadline: float) -> float:
    return _first_token(url, model, deadline, request_timeout=10, poll_s=0.05)


def through_vstack(tree: Path, config: Path, state: Path) -> float:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(tree), "VSTACK_STATE_DIR": str(state), "VSTACK_PORT": "0"}
    cli = [sys.executable, "-m", "stack.entrypoints.cli", "--config", str(config)]
    started = time.monotonic()
    up = subprocess.Popen([*cli, "up", "--port", str(port)], cwd=tree, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        return first_token(f"http://127.0.0.1:{port}", "smollm2-135m-instruct", started + 120) - started
    finally:
        up.wait(60)
        subprocess.run([*cli, "down"], cwd=tree, env=env, capture_output=True, timeout=120, check=False)


def alone(wrapper: Path) -> float:
    port = free_port()
    started = time.monotonic()
    proc = subprocess.Popen([str(wrapper), "-m", "stack.vllm.launcher", "serve", "m", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        return first_token(f"http://127.0.0.1:{port}", "m", started + 60) - started
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", required=True, help="comma-separated checkouts of this repository")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vstack-startup-overhead-"))
    wrapper = work / "engine-python"
    wrapper.write_text(WRAPPER.format(py=sys.executable, mock=ROOT / "tests" / "support" / "mock_upstream.py"))
    wrapper.chmod(0o755)
    config = work / "stand-in.yaml"
    config.write_text(f"engine_python: {wrapper}\nengine: {{enforce_eager: true, max_model_len: 512}}\n"
                      "env: {VLLM_CPU_KVCACHE_SPACE: '1'}\n")  # fmt: skip
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    runs: dict[str, list[float]] = {"engine alone": [], **{str(t): [] for t in trees}}
    for r in range(args.rounds):
        runs["engine alone"].append(round(alone(wrapper), 2))
        for i, tree in enumerate(trees):
            runs[str(tree)].append(round(through_vstack(tree, config, work / f"state-{r}-{i}"), 2))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in runs.items()), flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    added = {str(t): round(med[str(t)] - med["engine alone"], 2) for t in trees}
    for tree in trees:
        print(f"{tree}: `vstack up` to first token {med[str(tree)]:.2f} s, stand-in alone {med['engine alone']:.2f} s:"
              f" the stack adds {added[str(tree)]:.2f} s")
    if args.out:
        args.out.write_text(json.dumps({"runs": runs, "median_s": med, "added_s": added}, indent=2) + "\n")


if __name__ == "__main__":
    main()
