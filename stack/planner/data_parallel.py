"""Data-parallel engines (engine.data_parallel_size, vLLM's `--data-parallel-size`): N ranks in one engine,
each a whole copy of the model on its own tensor x pipeline parallel GPUs, behind one port; vLLM's front end
sends each request to the least loaded rank (its own queue counts, internal load balancing). adr/0051.

Each rank has its own scheduler and its own KV cache, so the fit is one rank's, as for one engine (weights +
KV per GPU); what the engine holds in all is that times the ranks. vLLM 0.26-0.33 starts as many API server
processes as ranks unless `api_server_count` says otherwise (entrypoints/cli/serve.py: "Defaulting
api_server_count to data_parallel_size").
"""

from __future__ import annotations

import math
from typing import Any

from stack.errors import ConfigError
from stack.vllm.lora import RUNTIME_ENV


def ranks(engine: dict[str, Any]) -> int:
    return int(engine.get("data_parallel_size") or 1)


def rank_gpus(engine: dict[str, Any]) -> int:
    """GPUs one copy of the model spans: tensor x pipeline parallel."""
    return int(engine.get("tensor_parallel_size") or 1) * int(engine.get("pipeline_parallel_size") or 1)


def engine_gpus(engine: dict[str, Any]) -> int:
    """GPUs one engine process group holds: its model's (tensor x pipeline), times its data-parallel copies."""
    return rank_gpus(engine) * ranks(engine)


def api_servers(engine: dict[str, Any]) -> int:
    """The API server processes vLLM starts: api_server_count when set, else one per rank (vLLM's default)."""
    given = engine.get("api_server_count")
    return int(given) if given else ranks(engine)


def per_rank(concurrency: int, engine: dict[str, Any]) -> int:
    """Requests each rank must hold for `concurrency` at once over all ranks (vLLM spreads them evenly)."""
    return math.ceil(concurrency / ranks(engine))


def check_data_parallel(engine: dict[str, Any], origins: dict[str, str], accelerator: str, gpus: int | None,
                        env: dict[str, str], hardware: str) -> None:  # fmt: skip
    """Refuse, before anything starts, a data-parallel engine the machine cannot run: more GPUs than there
    are, a CPU profile, or runtime LoRA updates with several API servers (vLLM refuses that at start)."""
    dp = ranks(engine)
    if dp <= 1:
        return
    where = origins.get("data_parallel_size", "engine.data_parallel_size")
    if accelerator != "gpu":
        raise ConfigError(
            f"{where}: data_parallel_size {dp} on a CPU profile ({hardware}): each rank would hold "
            "its own copy of the weights and its own VLLM_CPU_KVCACHE_SPACE, which the planner "
            "does not budget",
            hint=f"remove data_parallel_size there ({where.split(': ')[0]})",
        )
    tp, pp, width = (int(engine.get("tensor_parallel_size") or 1), int(engine.get("pipeline_parallel_size") or 1),
                     rank_gpus(engine))  # fmt: skip
    if gpus is not None and dp * width > gpus:
        most = gpus // width
        fix = f"set data_parallel_size to {most} or less there" if most >= 1 else "lower tensor_parallel_size"
        raise ConfigError(f"{where}: data_parallel_size {dp} x tensor_parallel_size {tp} x pipeline_parallel_size "
                          f"{pp} needs {dp * width} GPUs; there are {gpus} ({hardware})",
                          hint=f"{fix}, or serve it on hardware with {dp * width} GPUs")  # fmt: skip
    if env.get(RUNTIME_ENV, "").lower() in ("1", "true") and api_servers(engine) > 1:
        raise ConfigError(f"{where}: data_parallel_size {dp} starts {api_servers(engine)} API servers, and vLLM "
                          f"refuses {RUNTIME_ENV} (adapters loaded at run time) with more than one",
                          hint="set engine.api_server_count: 1 in the same profile, or the model's "
                          "lora.runtime_updates: false")  # fmt: skip


def describe(engine: dict[str, Any], gpus: int | None) -> str:
    """One line for the plan: the ranks, the GPUs each takes, the API servers."""
    dp, width = ranks(engine), rank_gpus(engine)
    each = f"{width} GPU{'s' if width > 1 else ''} each"
    of = f" of {gpus}" if gpus else ""
    servers = api_servers(engine)
    why = "api_server_count" if engine.get("api_server_count") else "vLLM's default: one per rank"
    return (
        f"data parallel: {dp} ranks x {each} = {dp * width}{of} GPUs, each rank a whole copy of the weights "
        f"with its own KV cache and scheduler; vLLM balances requests over the ranks behind one port; "
        f"{servers} API server process{'es' if servers > 1 else ''} ({why})"
    )
