"""Which GPUs of a multi-GPU host each local engine runs on (manager.gpu_placement, adr/0056).

vLLM counts an engine's GPUs from the first visible one, so every engine started without CUDA_VISIBLE_DEVICES
shares GPU 0, and the manager (which budgets per GPU) makes them take turns there while the other GPUs idle.
`spread` gives each unpinned engine, in the order the models are planned (the default model first), the GPUs the
engines placed before it need least memory of, and pins it there with CUDA_VISIBLE_DEVICES, as Ollama spreads
models over a host's GPUs: two one-GPU models on a 2-GPU host are then resident together. An engine the
configuration pins already (its `env` has CUDA_VISIBLE_DEVICES) keeps its GPUs and counts on them.

Nothing is placed with one model (nothing to share a GPU with), on one GPU, on Ray (Ray assigns GPUs) or in
containers, or when the gateway itself runs under CUDA_VISIBLE_DEVICES (its engines' indices would then be
relative to that list: the user chose the GPUs).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from stack.config.schema import StackConfig
from stack.engine_env import visible_gpus
from stack.planner import data_parallel
from stack.planner.model_planner import with_fingerprint
from stack.planner.plans import ModelPlan
from stack.vllm.options import VllmCatalog

VAR = "CUDA_VISIBLE_DEVICES"


def place_on_gpus(cfg: StackConfig, plans: list[ModelPlan], gpus: int, catalog: VllmCatalog,
                  environ: Mapping[str, str] = os.environ) -> tuple[list[ModelPlan], str | None]:  # fmt: skip
    """`plans` with the unpinned local GPU engines pinned where `spread` puts them, and the plan's note."""
    local = [p for p in plans if p.accelerator == "gpu"]
    if (cfg.manager.gpu_placement != "spread" or cfg.manager.runtime != "local" or gpus < 2 or len(local) < 2
            or VAR in environ or VAR in cfg.env):  # fmt: skip
        return plans, None
    used = [0] * gpus  # bytes per GPU of the engines placed so far
    placed: dict[str, str] = {}
    out = []
    for plan in plans:
        need = plan.fit.budget.requested if plan.fit is not None else 1 << 62  # unknown: a whole GPU
        width = data_parallel.engine_gpus(plan.engine)
        pinned = visible_gpus(plan.env, width)
        if plan.accelerator != "gpu" or width >= gpus or VAR in plan.env:
            for i in pinned if pinned is not None else range(min(width, gpus)):
                if i < gpus:
                    used[i] += need
            out.append(plan)
            continue
        chosen = sorted(sorted(range(gpus), key=lambda i: (used[i], i))[:width])
        for i in chosen:
            used[i] += need
        value = ",".join(map(str, chosen))
        placed[plan.served_name] = value
        out.append(with_fingerprint(plan, catalog, env={**plan.env, VAR: value},
                                    notes=(*plan.notes, f"GPU placement: GPU {value} ({VAR}, manager.gpu_placement: "
                                           "spread)")))  # fmt: skip
    if not placed:
        return plans, None
    where = ", ".join(f"{name} on GPU {value}" for name, value in placed.items())
    return out, (f"GPU placement: {where}, each on the GPUs the models before it use least (manager.gpu_placement: "
                 f"spread; pin one with {VAR} in its env)")  # fmt: skip
