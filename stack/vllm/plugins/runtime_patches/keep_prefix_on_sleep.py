"""Keep the KV offloading connector's CPU tier across a sleep, so that a model's prefix cache survives a switch.

vLLM 0.26-0.33: `EngineCore.sleep(level >= 1)` pauses the scheduler with `clear_cache=True`, and the pause's
`_reset_caches()` resets the KV connector as well as the GPU prefix cache (`reset_connector=True`). The GPU
prefix cache has to go (its memory is discarded by the sleep), but the CPU tier of the offloading connector
(`--kv-offloading-size`, pinned host memory the sleep does not touch) is dropped with it, so a model woken
after a switch recomputes every prompt it had cached.

With VSTACK_KEEP_PREFIX_ON_SLEEP=1 (the stack sets it where it configures the CPU tier: stack.vllm.kv_offload)
the reset a sleep causes leaves the connector alone: the GPU prefix cache is still reset, the CPU tier's
blocks stay, and after the wake a request with a known prefix loads them from host memory instead of
prefilling them. Safe because a pause completes only once the engine is idle, and it is not idle while the
connector has transfers pending (`Scheduler.has_requests` counts `connector.has_pending_push_work()`): every
block the CPU tier holds is complete before the GPU's blocks go. Other resets (a pause asked for with
clear_cache, /reset_prefix_cache) are upstream's.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from stack.vllm.kv_offload import KEEP_ENV as ENV

MARK = "_vstack_patch"
FLAG = "_vstack_sleep_keeps_connector"
log = logging.getLogger("vllm.vstack_patches")


def _sleep(original: Any) -> Any:
    @functools.wraps(original)
    def sleep(self: Any, level: int = 1, *args: Any, **kwargs: Any) -> Any:
        # The reset this sleep's pause makes (now, or once the engine is idle) keeps the connector.
        setattr(self, FLAG, level >= 1)
        return original(self, level, *args, **kwargs)

    setattr(sleep, MARK, "keep-prefix-cache-across-sleep")
    return sleep


def _reset_caches(original: Any) -> Any:
    @functools.wraps(original)
    def reset_caches(self: Any, reset_running_requests: bool = True, reset_connector: bool = True) -> Any:
        if getattr(self, FLAG, False):
            setattr(self, FLAG, False)
            if reset_connector:
                log.info("vstack: sleep keeps the KV connector's CPU tier (%s=1)", ENV)
            reset_connector = False
        return original(self, reset_running_requests=reset_running_requests, reset_connector=reset_connector)

    setattr(reset_caches, MARK, "keep-prefix-cache-across-sleep")
    return reset_caches


def _wake_up(original: Any) -> Any:
    @functools.wraps(original)
    def wake_up(self: Any, *args: Any, **kwargs: Any) -> Any:
        setattr(self, FLAG, False)  # a sleep whose pause never reset: no later reset may inherit it
        return original(self, *args, **kwargs)

    setattr(wake_up, MARK, "keep-prefix-cache-across-sleep")
    return wake_up


def apply() -> bool | str:
    if os.environ.get(ENV) != "1":
        return f"no {ENV}=1: no CPU tier to keep"  # upstream's behaviour, untouched
    from vllm.v1.engine.core import EngineCore

    if getattr(EngineCore.sleep, MARK, None):
        return False
    EngineCore.sleep = _sleep(EngineCore.sleep)  # type: ignore[method-assign]
    EngineCore._reset_caches = _reset_caches(EngineCore._reset_caches)  # type: ignore[method-assign]
    EngineCore.wake_up = _wake_up(EngineCore.wake_up)  # type: ignore[method-assign]
    return True
