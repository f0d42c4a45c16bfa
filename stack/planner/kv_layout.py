"""How vLLM's KV cache manager lays out one model's layers, derived from its code (vllm/v1/core/
kv_cache_utils.py, vllm/v1/kv_cache_interface.py; the same in 0.26 and 0.32 for the layouts below).

- One attention type on every layer (full attention, or the same sliding window everywhere): one group of
  all layers; a request at max_model_len needs cdiv(max_model_len, block_size) blocks (full) or
  cdiv(min(window - 1 + in-flight tokens, max_model_len), block_size) + 1 (sliding: the window plus the
  tokens scheduled but not settled - 2 x max_num_batched_tokens with async scheduling, see
  in_flight_tokens - and one block because a window need not start on a block boundary).
- Several types (Gemma-2's alternating sliding/global layers, Gemma-3's 5:1): groups of an equal number of
  layers, so that every group has the same page size and all draw blocks from one pool. The group size is
  the fewest layers of any type, or the most when the counts are within 1.5x (fewer padding layers);
  a type with fewer layers than a multiple of the group size is padded (`Add N padding layers`).
- A block of the pool holds one page of every layer of one group: group_size x page bytes.
- num_blocks = KV memory // (group_size x page bytes); `Maximum concurrency` = num_blocks / (blocks one
  request at max_model_len needs, summed over groups); `KV cache size` = concurrency x max_model_len.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LayerGroups:
    """vLLM's KV cache groups for a model: layers per group, and how many groups of each type."""

    group_size: int
    full_groups: int
    sliding_groups: int


def group_layers(full_layers: int, sliding_layers: int) -> LayerGroups:
    """Group the attention layers the way _get_kv_cache_groups_uniform_page_size does."""
    if not sliding_layers or not full_layers:
        return LayerGroups(full_layers + sliding_layers, int(full_layers > 0), int(sliding_layers > 0))
    fewest, most = min(full_layers, sliding_layers), max(full_layers, sliding_layers)
    size = most if most < fewest * 1.5 else fewest
    return LayerGroups(size, math.ceil(full_layers / size), math.ceil(sliding_layers / size))


def full_attention_blocks(max_len: int, block_size: int) -> int:
    """FullAttentionSpec.max_memory_usage_bytes / page size."""
    return math.ceil(max_len / block_size)


def sliding_window_blocks(window: int, max_len: int, batched_tokens: int, block_size: int) -> int:
    """SlidingWindowSpec.max_memory_usage_bytes / page size."""
    held = min(window - 1 + batched_tokens, max_len)
    return math.ceil(held / block_size) + 1


def in_flight_tokens(batched_tokens: int, engine: dict, accelerator: str) -> int:
    """VllmConfig.max_in_flight_tokens: the tokens scheduled but not yet settled, which a sliding window holds
    beyond itself. One batch of max_num_batched_tokens per concurrent step: two with async scheduling, which
    vLLM turns on by itself on GPUs (not with pipeline parallelism or a speculative method lacking it);
    the CPU build runs one (checked: bench/planner_check.py cpu, Gemma-2 shape)."""
    pipeline = int(engine.get("pipeline_parallel_size") or 1)
    asynchronous = engine.get("async_scheduling")
    if asynchronous is None:
        asynchronous = accelerator == "gpu" and pipeline == 1 and not engine.get("speculative_config")
    batches = 2 if asynchronous and pipeline == 1 else pipeline
    return batches * batched_tokens


# Bytes per element of each --kv-cache-dtype ("auto": the model's dtype, see cache_dtype_bytes).
KV_DTYPE_BYTES = {"auto": None, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
                  "fp8_inc": 1, "fp8_ds_mla": 1}
ENGINE_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


def cache_dtype_bytes(kv_cache_dtype: str, engine_dtype: str | None, model_dtype_bytes: int) -> int:
    """Bytes per cached element: the KV cache dtype when set (fp8: 1), else the dtype the model runs in -
    the engine's `dtype` when given (the CPU profile runs float32: 4), else the checkpoint's."""
    explicit = KV_DTYPE_BYTES.get(kv_cache_dtype)
    if explicit:
        return explicit
    return ENGINE_DTYPE_BYTES.get(str(engine_dtype or "auto"), model_dtype_bytes)
