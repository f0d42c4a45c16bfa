"""Hold an engine at the door of its device: imported, configured, its engine core up, but no memory taken.

`vstack tune` measures one candidate at a time on the GPU, and each start spent ~30 s of its ~117 s
(H200, 8B) before touching the device: the API server's import of vLLM and its config, then the engine
core's own. With VSTACK_START_GATE=PATH in an engine's environment, the worker's `init_device` (the first
call that takes device memory: CUDA context, the memory check, the weights after it) waits until PATH
exists. The tune starts the next candidate's engine while the current one is measured and creates PATH
once that engine has stopped, so the next start is only its device part.

`WorkerWrapperBase.init_device` is the one call every executor makes per worker (uniproc in the engine
core, multiproc and Ray in each worker process), in vLLM 0.26 through 0.33. While waiting, PATH.waiting
exists (a held engine is told from one still importing by it); a gate not opened within
VSTACK_START_GATE_TIMEOUT_S (default 3600) ends the engine rather than leaving it parked forever.
Without VSTACK_START_GATE nothing is changed.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from pathlib import Path
from typing import Any

from stack.vllm.plugins.start_gate_protocol import GATE_ENV, TIMEOUT_ENV, waiting_marker

MARK = "_vstack_patch"
log = logging.getLogger("vllm.vstack_patches")


def wait_for_gate(gate: Path, timeout_s: float, poll_s: float = 0.05) -> float:
    """Block until `gate` exists; returns the seconds waited. TimeoutError past `timeout_s`."""
    started = time.monotonic()
    if gate.exists():  # the other engine ended before this one had finished importing
        log.info("vstack start gate: open on arrival")
        return 0.0
    marker = waiting_marker(gate)
    marker.write_text(str(os.getpid()))
    log.info("vstack start gate: holding before the device until %s exists", gate)
    try:
        while not gate.exists():
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"vstack start gate {gate} not opened within {timeout_s:.0f} s "
                                   f"({TIMEOUT_ENV}): this engine is no longer wanted")  # fmt: skip
            time.sleep(poll_s)
    finally:
        marker.unlink(missing_ok=True)
    waited = time.monotonic() - started
    log.info("vstack start gate: open after %.1f s", waited)
    return waited


def _gated(init_device: Any) -> Any:
    @functools.wraps(init_device)
    def init_device_after_gate(self: Any) -> Any:
        gate = os.environ.get(GATE_ENV)
        if gate:
            wait_for_gate(Path(gate), float(os.environ.get(TIMEOUT_ENV) or 3600))
        return init_device(self)

    setattr(init_device_after_gate, MARK, "engine-start-gate")
    return init_device_after_gate


def apply() -> bool | str:
    if not os.environ.get(GATE_ENV):
        return f"no {GATE_ENV}: not an engine a tune holds"  # upstream's behaviour, untouched
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    if getattr(WorkerWrapperBase.init_device, MARK, None):
        return False
    WorkerWrapperBase.init_device = _gated(WorkerWrapperBase.init_device)  # type: ignore[method-assign]
    return True
