"""Two models on a host of two GPUs (adr/0056): `manager.gpu_placement: spread` (the default) against `first`, in
one run on the same host.

`vstack up A` with `manager.models: [A, B]` (the 8B and 7B shapes, dummy weights, eager, an 8k context, each at
the hardware profile's utilization, so the two never fit awake on one GPU), then requests for A, B, A, B. With
`spread` the plan pins A to GPU 0 and B to GPU 1: B's first request starts it beside A, and every later request
finds its model resident (no switch). With `first` both count from GPU 0: B's first request puts A to sleep, and
each later request is a switch. Per request: its first token (the openai client), both models' states, each
GPU's used memory (NVML), the plan's placement line.

    python3 -m bench.gpu.placement --out $OUT/placement.json [--sides spread,first]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gpu.device import Device, detect  # noqa: E402
from bench.gpu.profiles import prepare  # noqa: E402
from bench.gpu.switching import ENGINE, MODEL_A, MODEL_B, first_token, served, states  # noqa: E402

GIB = 1024**3


def side(cfg: Any, device: Device, work: Path, log_dir: Path, placement: str) -> dict[str, Any]:
    run = prepare(cfg, MODEL_A, device, work / placement, extra_models=[MODEL_B], engine=ENGINE,
                  manager={"models": [MODEL_A, MODEL_B], "min_residency_s": 0, "quiet_s": 0,
                           "queue_timeout_s": 600, "gpu_placement": placement})  # fmt: skip
    out: dict[str, Any] = {"placement": placement, "steps": []}
    with served(run, device, log_dir, f"placement-{placement}", out) as base:
        if base is not None:
            first_token(base, MODEL_A)
            for model in (MODEL_B, MODEL_A, MODEL_B, MODEL_A):
                seconds = first_token(base, model)
                out["steps"].append({"to": model, "first_token_s": round(seconds, 3),
                                     "states": states(base, run.state_dir),
                                     "used_gib": [round(u / GIB, 1) for u in device.used_bytes()]})  # fmt: skip
                print(placement, json.dumps(out["steps"][-1]), flush=True)
    # What the planner decided, as the gateway logged it at `vstack up` (one line; wrapped tables lose it).
    gateway = log_dir / f"placement-{placement}--gateway.log"
    lines = gateway.read_text(errors="replace").splitlines() if gateway.exists() else []
    out["placement_lines"] = [line.split(" INFO ", 1)[-1] for line in lines
                              if "GPU placement:" in line or "sleep handoff" in line][:4]  # fmt: skip
    return out


def judge(sides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """spread: both resident after B's first request, each GPU holding one engine, no later request slower than
    0.5 s; first: B's request put A to sleep (the one-GPU behaviour the manager keeps when not spread)."""
    verdict: dict[str, Any] = {}
    spread = sides.get("spread", {}).get("steps", [])
    if spread:
        resident = all(set(s["states"].values()) == {"ready"} for s in spread)
        both_gpus = all(min(s["used_gib"][:2]) > 20 for s in spread)
        later = [s["first_token_s"] for s in spread[1:]]
        verdict["spread"] = {"both_resident": resident, "both_gpus_hold_an_engine": both_gpus,
                             "later_first_token_max_s": max(later) if later else None,
                             "ok": resident and both_gpus and bool(later) and max(later) < 0.5}  # fmt: skip
    first = sides.get("first", {}).get("steps", [])
    if first:
        verdict["first"] = {"b_evicted_a": first[0]["states"].get(MODEL_A) == "sleeping",
                            "switch_first_token_s": [s["first_token_s"] for s in first]}  # fmt: skip
    return verdict


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sides", default="spread,first")
    args = ap.parse_args()
    from stack.config import load_config

    device = detect()
    if device.count < 2:
        print(f"placement needs a host of 2 GPUs or more ({device.count} here): run it on nvidia-h200-x2")
        return 2
    work, log_dir = Path("/tmp/vstack-gpu-placement"), args.out.parent
    result: dict[str, Any] = {"device": device.label, "date": time.strftime("%Y-%m-%d"), "sides": {}}
    for placement in args.sides.split(","):
        result["sides"][placement] = side(load_config(), device, work, log_dir, placement)
        args.out.write_text(json.dumps(result, indent=2) + "\n")  # a call cut short keeps what ran
    result["verdict"] = judge(result["sides"])
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["verdict"], indent=1))
    return 0 if result["verdict"].get("spread", {}).get("ok") else 1


if __name__ == "__main__":
    raise SystemExit(main())
