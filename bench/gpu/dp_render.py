"""The command `vstack up` would run for the data-parallel profile on this GPU host (bench/gpu/data_parallel.sh):
an overlay puts a dummy-weights folder of the 8B's shape under the model and sets the ranks, then the repo's own
planner renders the plan (plan_model: fit, refusals, argv for the installed vLLM). Prints one JSON object:
args (after `vllm serve`), env, served name, the fit's summary and notes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from bench.harness.dummy_models import fixture_config, write_model

PROFILE = "h200x4-llama-3.1-8b-dp4"


def overlay(work: Path, ranks: int, engine: dict[str, Any]) -> Path:
    folder = write_model(work / "models" / "llama-3.1-8b", fixture_config("meta-llama--Llama-3.1-8B-Instruct"))
    data = {"state_dir": str(work / "state"), "cache_dir": str(work / "cache"),
            "models": {"llama-3.1-8b-instruct": {"source": {"path": str(folder)}}},
            # On the profile, not stack-wide: a stack-level data_parallel_size would reach the 1-GPU profiles too.
            "profiles": {PROFILE: {"engine": {"data_parallel_size": ranks, "load_format": "dummy", **engine}}}}
    path = work / "overlay-dp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", type=Path)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--engine", default="{}", help="JSON: more engine options on the profile")
    a = ap.parse_args()
    from stack.config import load_config
    from stack.hardware import detect
    from stack.planner.model_planner import plan_model
    from stack.vllm.options import installed_catalog

    cfg = load_config(overlay(a.work, a.ranks, json.loads(a.engine)))
    plan = plan_model(cfg, PROFILE, detect(), installed_catalog(sys.executable, a.work / "cache"), port=a.port)
    print(json.dumps({"args": plan.vllm_args(), "env": plan.env, "served": plan.served_name,
                      "summary": plan.fit.summary() if plan.fit else None, "notes": list(plan.notes)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
