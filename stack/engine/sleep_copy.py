"""What a GPU engine's runtime needs of the weights' host copy kept between sleeps (runtime patch
`gpu-sleep-wake-at-bus-speed`, stack/patches/runtime/fast_sleep_wake.py). Whether it is kept is decided when
the model is planned (stack.planner.host_copy); this is the variable that says so to the engine, and the RPC
that fills the copy once the engine serves.
"""

from __future__ import annotations

from typing import Any

from stack.planner.host_copy import KEEP_ENV, keep_host_copy

__all__ = ["KEEP_ENV", "STAGE_METHOD", "sleep_copy_env"]
# The collective_rpc method (runtime patch) that allocates, and where kept fills, the host buffers of the first
# sleep in the background once the engine serves: the first switch then costs what later ones do.
STAGE_METHOD = "vstack_stage_host_copy"


def sleep_copy_env(engine: dict[str, Any]) -> dict[str, str]:
    """The engine's environment for it: {KEEP_ENV: "1"} where keeping is exact, else nothing."""
    return {KEEP_ENV: "1"} if keep_host_copy(engine)[0] else {}
