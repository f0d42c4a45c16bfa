"""The phases of a start as `vstack up` waits for it: planning, fetching or converting the model (said by
the planning in `vstack up`'s own process), the gateway starting, then the engine's own (loading weights,
compiling, capturing graphs, API server), each printed with its seconds once it is over, the current one on
a spinner (stack.engine.phases reads the lines)."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.spinner import Spinner
from rich.text import Text

from stack.engine.phases import ENGINE_PHASES, GATEWAY_PHASES, phase_of
from stack.engine.records import engine_records

PLANNING = ("planning", "fetching the model", "converting the model")  # in `vstack up`'s own process


class Follower:
    """New lines of an appended file since the last read (from `offset`)."""

    def __init__(self, path: Path | None, offset: int = 0) -> None:
        self.path, self.offset, self.last = path, offset, ""

    def lines(self) -> list[str]:
        if self.path is None:
            return []
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        cut = data.rfind(b"\n") + 1  # a half-written line waits for its end
        self.offset += cut
        lines = data[:cut].decode(errors="replace").splitlines()
        for line in reversed(lines):
            if line.strip():
                self.last = line.strip()
                break
        return lines


class StartProgress:
    """Follows the gateway's log and (once its record names it) the default engine's log."""

    def __init__(self, console: Console, gateway_log: Path, offset: int, state_dir: Path, owner: int) -> None:
        self.console, self.state_dir, self.owner = console, state_dir, owner
        self.gateway = Follower(gateway_log, offset)
        self.engine: Follower | None = None
        self.phase, self.since = "planning", time.monotonic()
        self.spinner = Spinner("dots", text="planning")
        self.done: list[tuple[str, float]] = []
        self.began = time.time()
        self.planned_s = 0.0  # seconds the planning took in this process, before the gateway was started

    def said(self, line: str, elapsed: float) -> Spinner:
        """A status line of the planning (fetching, converting): its phase, shown on the spinner."""
        self.enter(phase_of([line], GATEWAY_PHASES, self.phase))
        self.gateway.last = line.strip() or self.gateway.last
        return self._show(elapsed)

    def _engine_log(self) -> Follower | None:
        for record in engine_records(self.state_dir).all():
            # a re-attached engine started before this `up`: its log holds an earlier start, not this one
            if record.owner == self.owner and record.log_path and record.started_at >= self.began - 1:
                path = Path(record.log_path)
                # the record is written right after the spawn, which marks its start in the log first
                text = path.read_text(errors="replace") if path.is_file() else ""
                at = text.rfind("==> vstack: starting ")
                return Follower(path, len(text[:at].encode()) if at >= 0 else len(text.encode()))
        return None

    def poll(self, elapsed: float) -> Spinner:
        if self.phase in PLANNING:  # the plan is made: the gateway process starts, with its own lines
            self.enter("gateway starting")
        phase = phase_of(self.gateway.lines(), GATEWAY_PHASES, self.phase)
        if self.engine is None:
            self.engine = self._engine_log()
        if self.engine is not None:
            phase = phase_of(self.engine.lines(), ENGINE_PHASES,
                             phase if phase != "gateway starting" else "engine starting")
        self.enter(phase)
        return self._show(elapsed + self.planned_s)

    def _show(self, elapsed: float) -> Spinner:
        last = (self.engine.last if self.engine else "") or self.gateway.last
        self.spinner.update(text=Text.assemble((f"{self.phase} ", "bold"), (f"{elapsed:5.0f} s  ", "cyan"),
                                               (last[-100:], "dim")))  # fmt: skip
        return self.spinner

    def enter(self, phase: str) -> None:
        if phase == self.phase:
            return
        now = time.monotonic()
        self.done.append((self.phase, now - self.since))
        self.console.print(f"  [green]✓[/] {self.phase} [dim]{now - self.since:.1f} s[/]")
        self.phase, self.since = phase, now
