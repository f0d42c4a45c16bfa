"""Whether a GPU engine may keep its weights' host copy between sleeps (runtime patch
`gpu-sleep-wake-at-bus-speed`, stack/vllm/plugins/runtime_patches/fast_sleep_wake.py): decided when the model
is planned, recorded in its ModelPlan (`keeps_host_copy`) and said to the engine by KEEP_ENV.

Kept, a sleep after the first only unmaps: no copy over the bus. That is exact only while the weights cannot
change on the GPU between two sleeps, so it is refused for the engine options under which vLLM writes to
memory allocated as weights at run time.
"""

from __future__ import annotations

from typing import Any

from stack.vllm.plugins.host_copy import KEEP_ENV

__all__ = ["KEEP_ENV", "keep_host_copy"]
# engine option -> why the weights' memory changes while the engine serves
WRITES_WEIGHTS = {
    "enable_lora": "LoRA adapters are loaded into slots allocated with the weights",
    "calculate_kv_scales": "KV cache scales are computed from the first requests",
    "enable_eplb": "expert load balancing moves experts between GPUs",
}


def keep_host_copy(engine: dict[str, Any]) -> tuple[bool, str]:
    """(keep, why) for an engine's resolved options."""
    if not engine.get("enable_sleep_mode"):
        return False, "sleep mode off"
    for option, why in WRITES_WEIGHTS.items():
        if engine.get(option):
            return False, f"weights' host copy not kept between sleeps: {why} ({option})"
    return True, "weights' host copy kept between sleeps: a sleep after the first only unmaps (weights never change)"
