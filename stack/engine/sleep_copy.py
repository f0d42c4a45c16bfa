"""What a GPU engine's runtime needs of the weights' host copy kept between sleeps (runtime patch
`gpu-sleep-wake-at-bus-speed`, stack/vllm/plugins/runtime_patches/fast_sleep_wake.py). Whether it is kept is
decided when the model is planned (stack.planner.keep_host_copy); this is the variable that says so to the engine
(the protocol's names: stack.vllm.plugins.host_copy).
"""

from __future__ import annotations

from typing import Any

from stack.planner.keep_host_copy import keep_host_copy
from stack.vllm.plugins.host_copy import KEEP_ENV


def sleep_copy_env(engine: dict[str, Any]) -> dict[str, str]:
    """The engine's environment for it: {KEEP_ENV: "1"} where keeping is exact, else nothing."""
    return {KEEP_ENV: "1"} if keep_host_copy(engine)[0] else {}
