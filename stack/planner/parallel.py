"""vLLM's own constraints on tensor parallelism, checked before an engine starts (it would fail minutes in).

vLLM requires the attention heads to divide evenly across the tensor-parallel ranks, and the KV heads
either to divide evenly too or (fewer KV heads than ranks) to be replicated an integral number of times
(vllm/config/model.py `verify_with_parallel_config`, and the KV-head replication in its attention layers).
"""

from __future__ import annotations

from typing import Any

from stack.errors import ConfigError
from stack.planner.model_meta import ModelShape


def check_tensor_parallel(shape: ModelShape, engine: dict[str, Any], origins: dict[str, str], gpus: int | None,
                          model: str) -> None:  # fmt: skip
    tp = engine.get("tensor_parallel_size")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp <= 1:
        return
    where = origins.get("tensor_parallel_size", "engine.tensor_parallel_size")
    problems = []
    if gpus is not None and tp > gpus:
        problems.append(f"{where}: tensor_parallel_size {tp} is more than the {gpus} GPU(s) there are")
    heads, kv = shape.num_attention_heads, shape.num_kv_heads
    if heads % tp:
        problems.append(f"{where}: tensor_parallel_size {tp} does not divide {model}'s {heads} attention heads")
    elif kv % tp if kv >= tp else tp % kv:
        problems.append(f"{where}: tensor_parallel_size {tp} and {model}'s {kv} KV heads: vLLM needs one to "
                        "divide the other")
    if problems:
        fits = [n for n in (1, 2, 4, 8, 16) if heads % n == 0 and (kv % n == 0 if kv >= n else n % kv == 0)
                and (gpus is None or n <= gpus)]
        raise ConfigError(problems, hint=f"use a tensor_parallel_size of {', '.join(map(str, fits))}")
