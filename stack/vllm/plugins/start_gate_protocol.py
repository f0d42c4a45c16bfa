"""The start gate's protocol, shared by the tune (stack.tune.prestart) and the patch inside vLLM
(stack.vllm.plugins.runtime_patches.start_gate): an engine started with GATE_ENV=PATH waits before its device until
PATH exists, shows PATH.waiting while it waits, and gives up after TIMEOUT_ENV seconds."""

from __future__ import annotations

from pathlib import Path

GATE_ENV = "VSTACK_START_GATE"
TIMEOUT_ENV = "VSTACK_START_GATE_TIMEOUT_S"


def waiting_marker(gate: Path) -> Path:
    return gate.with_name(gate.name + ".waiting")
