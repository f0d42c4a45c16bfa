"""A deliberately bad candidate for the upgrade gate's tests: a runtime patch that sleeps in every model step.

Loaded only through a test ledger (slow-ledger.yaml, given to `vstack upgrade check --candidate-ledger`), in
the candidate's engines alone, by the stack's own runtime-patch plugin. Every decode step then takes
VSTACK_TEST_STEP_DELAY_S (default 0.25 s) longer: answers stay the same, goodput at a TPOT SLO does not.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

DELAY_ENV = "VSTACK_TEST_STEP_DELAY_S"


def apply() -> bool | str:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # the CPU runner's base: one call per step

    original = GPUModelRunner.execute_model
    if getattr(original, "_vstack_slow", False):
        return False
    delay = float(os.environ.get(DELAY_ENV, "0.25"))

    @functools.wraps(original)
    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(delay)
        return original(self, *args, **kwargs)

    execute_model._vstack_slow = True  # type: ignore[attr-defined]
    GPUModelRunner.execute_model = execute_model  # type: ignore[method-assign]
    return True
