"""The default engine spawned by the gateway process before it imports anything (issue 37, item 1).

`vstack up` plans in the CLI, then starts the gateway process, which spent ~1.5 s importing the configuration
schema, the planner and the engine runtime before it could spawn the engine (the startup bench's "gateway
process to engine spawn": 1.5-2.0 s on every GPU run). The CLI has all that loaded already: it draws the
default engine's spec (its port, its key) and hands it over on the gateway's stdin with the plan's secrets
(`payload`); the gateway process spawns it first thing (`spawn`: the standard library only), and the
assembly adopts it as the engine it would have started (stack.assemble.start_early) once it has checked that
the command is the plan's own; otherwise the early process is stopped and the engine started as before.

Only for a local engine process with nothing to attach to: no container, no Ray replica, no sleep handoff
socket (its broker opens in the gateway), no running engine of that name to re-attach.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stack.config.schema import StackConfig
    from stack.engine.process import EngineSpec
    from stack.planner.plans import StackPlan

KEY = "early_engine"  # where the payload goes in the JSON on the gateway's stdin


@dataclass
class EarlyEngine:
    """The process `spawn` started, until the assembly adopts it (or stops it)."""

    spec: dict[str, Any]
    popen: subprocess.Popen[bytes] | None = None
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


def payload(plan: StackPlan, cfg: StackConfig) -> dict[str, Any] | None:
    """What the CLI hands the gateway process for an early spawn of the plan's default engine; None where the
    gateway must start it itself (see the module's docstring)."""
    from stack.engine.launch import engine_spec, log_path_for
    from stack.engine.records import engine_records
    from stack.engine_env import engine_environ

    default = plan.default
    if plan.site is not None or plan.cluster is not None or default.handoff:
        return None
    record = engine_records(cfg.state_dir).get(default.served_name)
    if record is not None and record.alive():  # kept running or asleep: the gateway re-attaches it
        return None
    spec = engine_spec(default, log_path_for(cfg, default))
    return {
        "spec": spec_data(spec),
        "environ": engine_environ({**spec.env, "PYTHONUNBUFFERED": "1"}, spec.api_key, spec.drop_env),
    }


def spec_data(spec: EngineSpec) -> dict[str, Any]:
    """The spec as JSON data (EngineSpec(**data) with its Path and tuple back is the same spec)."""
    return {**dataclasses.asdict(spec), "log_path": str(spec.log_path), "drop_env": list(spec.drop_env)}


def open_log(log_path: str | os.PathLike[str], display_argv: list[str] | tuple[str, ...]) -> tuple[IO[bytes], int]:
    """The engine's log opened for appending, with this start's header written; and its size before, where this
    start's lines begin (what a failed start's message quotes). Raises OSError (a full disk, a read-only state
    directory): EngineProcess.start says so with a hint, `spawn` leaves the start to the assembly."""
    from pathlib import Path

    from stack.engine.diagnose import log_size  # the standard library only, as this module

    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    start = log_size(Path(log_path))
    log = open(log_path, "ab")  # noqa: SIM115 (the caller closes it once the child holds it)
    try:
        log.write(f"\n==> vstack: starting {' '.join(display_argv)}\n".encode())
        log.flush()
    except OSError:
        log.close()
        raise
    return log, start


def launch(argv: list[str] | tuple[str, ...], log: IO[bytes], environ: dict[str, str]) -> subprocess.Popen[bytes]:
    """Every local engine process starts this way (EngineProcess.start, and `spawn` before the gateway's
    imports): output to its log, no stdin, its own session (stopped as a group, not by a Ctrl-C at the CLI)."""
    return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environ,
                            start_new_session=True)  # fmt: skip


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
