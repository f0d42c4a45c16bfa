"""Rules of vLLM's CPU build that both the launcher and the fit planner apply (one copy of each)."""

from __future__ import annotations

from stack.config.schema import CpuKvCache

GIB = 1024**3
CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"


def kv_cache_gib(ram_available: int, rule: CpuKvCache) -> int:
    """VLLM_CPU_KVCACHE_SPACE (whole GiB: vLLM reads it with int()) from the memory free now, bounded by
    the hardware profile's rule; never vLLM's default of 92% of all RAM."""
    free_gib = ram_available / GIB
    return max(1, int(max(rule.min_gib, min(rule.max_gib, free_gib * rule.fraction_of_free))))
