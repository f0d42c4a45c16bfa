"""How every local engine process starts (EngineProcess.start, and stack.engine.early_spawn before the gateway's
imports): its log opened with a header, then Popen in a session of its own. The standard library only, so that
the gateway process can spawn its default engine before it imports anything of the stack."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import IO

from stack.engine.diagnose import log_size
from stack.engine.zygote import ForkedEngine, forked

Started = subprocess.Popen[bytes] | ForkedEngine  # what `launch` gives: a pid, poll() and wait()


def open_log(log_path: str | os.PathLike[str], display_argv: list[str] | tuple[str, ...]) -> tuple[IO[bytes], int]:
    """The engine's log opened for appending, with this start's header written; and its size before, where this
    start's lines begin (what a failed start's message quotes). Raises OSError (a full disk, a read-only state
    directory): EngineProcess.start says so with a hint, early_spawn.spawn leaves the start to the assembly."""
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


def launch(argv: list[str] | tuple[str, ...], log: IO[bytes], environ: dict[str, str]) -> Started:
    """Every local engine process starts this way (EngineProcess.start, and early_spawn.spawn before the gateway's
    imports): output to its log, no stdin, its own session (stopped as a group, not by a Ctrl-C at the CLI).
    Forked by the test suite's zygote where it runs one (stack.engine.zygote), exec'd everywhere else."""
    if (child := forked(argv, log, environ)) is not None:
        return child
    return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environ,
                            start_new_session=True)  # fmt: skip
