"""Helpers for tests whose engines outlive their gateway (kept and kept-asleep engines)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil

from stack.engine.records import engine_records

NO_SUCH_PID = 2**22 + 7  # above the default pid_max


def owner_gone(state_dir: Path, name: str) -> None:
    """The gateway that kept engine `name` has exited: its record names an owner that no longer runs."""
    store = engine_records(state_dir)
    record = store.get(name)
    assert record is not None
    record.owner = NO_SUCH_PID
    store.save(record)


def kill_strays() -> Iterator[None]:
    """Body of an autouse fixture: every child process a test leaves behind is killed after it."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    for p in psutil.Process().children(recursive=True):
        if p.pid not in before:
            p.kill()
