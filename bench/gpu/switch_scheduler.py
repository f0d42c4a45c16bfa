"""The switch schedulers on real engines (issue 31, item 3): the same seeded two-model Poisson traces as
bench/switch_scheduler.py (70/30 and 50/50), replayed through `vstack up` with two shipped models (8B and 7B
shapes, dummy weights) that cannot be awake together on this GPU, once per policy.

    python3 -m bench.gpu.switch_scheduler --out F.json [--rate 1.5] [--duration-s 120] [--policies fifo,grouped]

Policies as bench/switch_scheduler.py's: fifo (min_residency_s 0, quiet_s 0: llama-swap's), residency (the
manager's earlier default), grouped (max_wait_s). Goodput: requests with TTFT within --slo-ttft-s per second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from bench.gpu.device import detect
from bench.gpu.profiles import prepare, vstack
from bench.harness.trace_replay import poisson_trace, replay_on_gateway, summary
from bench.harness.waiting import free_port

MODEL_A, MODEL_B = "llama-3.1-8b-instruct", "qwen2.5-7b-instruct"
MIXES = {"70-30": {"a": 0.7, "b": 0.3}, "50-50": {"a": 0.5, "b": 0.5}}


def policies(max_wait_s: float) -> dict[str, dict[str, Any]]:
    return {
        "fifo": {"scheduler": "residency", "min_residency_s": 0, "quiet_s": 0},
        "residency": {"scheduler": "residency", "min_residency_s": 20, "quiet_s": 2},
        "grouped": {"scheduler": "grouped", "max_wait_s": max_wait_s, "quiet_s": 2},
    }


def run_policy(cfg: Any, name: str, policy: dict[str, Any], args: argparse.Namespace, log_dir: Path) -> dict:
    device = detect()
    manager = {"models": [MODEL_A, MODEL_B], "queue_max": 100_000, "queue_timeout_s": 3600, "drain_timeout_s": 600,
               "idle_ttl_s": 0, **policy}  # fmt: skip
    run = prepare(cfg, MODEL_A, device, args.work / name, extra_models=[MODEL_B],
                  engine={"enforce_eager": True, "max_model_len": 4096}, manager=manager)  # fmt: skip
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {"policy": policy, "runs": {}}
    try:
        up = vstack(run, "up", MODEL_A, "--port", str(port))
        if up.returncode != 0:
            out["error"] = (up.stdout + up.stderr)[-3000:]
            return out
        models = {"a": MODEL_A, "b": MODEL_B}
        for model in (MODEL_B, MODEL_A):  # both started once: every later switch is a sleep + wake
            vstack(run, "switch", model)
        for mix_name, mix in MIXES.items():
            trace = poisson_trace(args.rate, args.duration_s, mix, args.seed)
            served = asyncio.run(replay_on_gateway(base, trace, models, max_tokens=args.max_tokens))
            out["runs"][mix_name] = summary(served, args.slo_ttft_s, args.duration_s)
            print(f"{name} {mix_name}: {json.dumps(out['runs'][mix_name])}", flush=True)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        vstack(run, "down", "--all", timeout=300)
        for log in (run.state_dir / "logs").glob("*.log"):
            (log_dir / f"sched-{name}--{log.name}").write_bytes(log.read_bytes()[-300_000:])
    return out


def main(argv: list[str] | None = None) -> int:
    from stack.config import load_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rate", type=float, default=1.5)
    ap.add_argument("--duration-s", type=float, default=120)
    ap.add_argument("--slo-ttft-s", type=float, default=8.0)
    ap.add_argument("--max-wait-s", type=float, default=4.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policies", default="fifo,residency,grouped")
    ap.add_argument("--work", type=Path, default=Path("/tmp/vstack-gpu-sched"))
    args = ap.parse_args(argv)
    log_dir = args.out.parent / "switch-scheduler-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    cfg = load_config()
    result: dict[str, Any] = {"params": {k: str(v) for k, v in vars(args).items()}, "policies": {}}
    for name in args.policies.split(","):
        result["policies"][name] = run_policy(cfg, name, policies(args.max_wait_s)[name], args, log_dir)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
