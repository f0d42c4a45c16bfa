"""Test and benchmark engines start the way `vstack up` starts them: argv and env rendered by the stack itself
(stack.planner.model_planner.plan_model: the CPU dtype decision, the launcher, vLLM's own options),
never a hand-written vLLM command line that could drift from what users run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Small and quick on 2 shared cores: no torch.compile, a 1 GiB KV cache, threads not pinned.
TEST_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "HF_HUB_OFFLINE": "1"}


def rendered_engine(model_dir: Path | str, served: str, port: int, config: dict[str, Any] | None = None,
                    **engine: Any) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """(argv, env) for serving the model folder as `served` on 127.0.0.1:port with these engine options;
    config: more of the stack's configuration (observability: the engine's tracing)."""
    from stack.config import load_config
    from stack.hardware import detect
    from stack.planner.model_planner import plan_model
    from stack.vllm.options import engine_python, installed_catalog

    # Top-level engine/env: above any profile the configs ship for this model (as VSTACK_ENGINE__* would be).
    entry = {"name": served, "source": {"path": str(model_dir)}, "served_name": served}
    cfg = load_config(text=json.dumps({"models": {served: entry}, "engine": {"enforce_eager": True, **engine},
                                       "env": TEST_ENV, **(config or {})}))  # fmt: skip
    info = detect()
    catalog = installed_catalog(engine_python(cfg.engine_python), cfg.cache_dir)
    plan = plan_model(cfg, served, info, catalog, port=port, for_launch=info.accelerator == "cpu")
    return plan.argv(), {**plan.env, "PYTHONUNBUFFERED": "1"}
