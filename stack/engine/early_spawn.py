"""The default engine spawned by the gateway process before it imports anything (issue 37, item 1).

`vstack up` plans in the CLI, then starts the gateway process, which spent ~1.5 s importing the configuration
schema, the planner and the engine runtime before it could spawn the engine (the startup bench's "gateway
process to engine spawn": 1.5-2.0 s on every GPU run). The CLI has all that loaded already: it draws the
default engine's spec (its port, its key) and hands it over on the gateway's stdin with the plan's secrets
(`payload`); the gateway process spawns it first thing (`spawn`: the standard library only), and the
assembly adopts it as the engine it would have started (stack.assemble.runtimes.start_early) once it has checked that
the command is the plan's own; otherwise the early process is stopped and the engine started as before.

Only for a local engine process with nothing to attach to: no container, no Ray replica, no sleep handoff
socket (its broker opens in the gateway), no running engine of that name to re-attach. What the CLI hands over
is drawn by stack.engine.launch.early_payload (above this module: it needs the planner and the engine runtime);
the process is started as every engine is (stack.engine.popen).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from stack.engine.popen import Started, launch, open_log  # the standard library only, as this module

KEY = "early_engine"  # where the payload goes in the JSON on the gateway's stdin


@dataclass
class EarlyEngine:
    """The process `spawn` started, until the assembly adopts it (or stops it)."""

    spec: dict[str, Any]
    popen: Started | None = None
    log_start: int = 0
    started_at: float = 0.0
    error: str = ""
    adopted: bool = field(default=False)

    def stop(self, grace: float = 10.0) -> None:
        """Stop it with its descendants and group, as any engine is stopped, unless the assembly took it over
        (called once the gateway's imports are done: stack.engine.process is loaded by then)."""
        if self.adopted or self.popen is None or self.popen.poll() is not None:
            return
        from stack.engine.process import stop_process_tree

        stop_process_tree(self.popen.pid, grace)
        self.popen.poll()  # reaped, if the wait above did not


def spawn(data: dict[str, Any]) -> EarlyEngine:
    """Start the engine as EngineProcess.start does (`open_log`, `launch`); a failure to spawn is kept in
    `error`, and the assembly starts the engine the usual way (which reports it)."""
    spec = data["spec"]
    early = EarlyEngine(spec=spec)
    try:
        log, early.log_start = open_log(spec["log_path"], spec["display_argv"])
        with log:
            early.popen = launch(spec["argv"], log, data["environ"])
        early.started_at = time.time()
    except OSError as exc:
        early.error = f"{type(exc).__name__}: {exc}"
    return early
