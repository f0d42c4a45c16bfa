"""The next candidate's engine, started while the current one is measured, held before its device.

A tune measures one candidate at a time: on a GPU two engines cannot both hold their memory. But ~30 s
of each start (H200, 8B) is vLLM's imports and config in its API server and engine core, with no device
memory taken. The ledger's `engine-start-gate` patch (stack/vllm/plugins/runtime_patches/start_gate.py) holds an engine
started with VSTACK_START_GATE before its device; `open` lets it go once the current engine has stopped.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from pathlib import Path

from stack.engine.process import EngineProcess
from stack.vllm.plugins.start_gate_protocol import GATE_ENV, TIMEOUT_ENV, waiting_marker

GATE_PATCH = "engine-start-gate"


@dataclass
class Prestart:
    key: str  # the candidate it belongs to
    engine: EngineProcess
    gate: Path
    launched: float

    @classmethod
    def launch(cls, key: str, engine: EngineProcess, gates: Path, hold_s: float) -> Prestart:
        """Start `engine` held at its gate; it gives up by itself after `hold_s` (a tune killed meanwhile)."""
        gates.mkdir(parents=True, exist_ok=True)
        gate = gates / f"{key}.gate"
        gate.unlink(missing_ok=True)
        # vLLM's front end waits VLLM_ENGINE_READY_TIMEOUT_S (600) for its engine core: the hold counts.
        env = {GATE_ENV: str(gate), TIMEOUT_ENV: f"{hold_s:.0f}", "VLLM_ENGINE_READY_TIMEOUT_S": f"{hold_s + 900:.0f}"}
        engine.spec = replace(engine.spec, env={**engine.spec.env, **env})
        engine.start()
        return cls(key, engine, gate, time.monotonic())

    def alive(self) -> bool:
        return self.engine.exit_code() is None

    def open(self) -> float:
        """Let it take the device; returns how long it had been starting in the shadow of the other."""
        self.gate.touch()
        return time.monotonic() - self.launched

    def discard(self, grace: float) -> None:
        """Not measured after all (a paused or ended tune, or it exited while held): stop it, leave no file."""
        self.engine.stop(grace)
        self.cleanup()

    def cleanup(self) -> None:
        for path in (self.gate, waiting_marker(self.gate)):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
