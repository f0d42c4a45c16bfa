"""`vstack logs [MODEL] [-f]`: the gateway's log, or one model's engine log, of what `vstack up` started here
(the files under state_dir/logs); -f follows it as `tail -f` does, until Ctrl-C."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from stack.cli import complete
from stack.cli.every_command import ConfigOpt, cli_config, run
from stack.cli.log_files import GATEWAY_LOG, engine_logs
from stack.config.origins import suggest
from stack.engine.diagnose import log_tail
from stack.errors import ExitCode, ModelSourceError, StackError


def log_of(folder: Path, model: str | None) -> Path:
    if model is None:
        path = folder / GATEWAY_LOG
        if not path.is_file():
            raise StackError(f"no gateway log in {folder}", hint="`vstack up` writes it; a gateway elsewhere: "
                             "`docker compose logs -f` (Compose) or its host's `vstack logs`")
        return path
    logs = engine_logs(folder)
    if model not in logs:
        raise ModelSourceError(f"no engine log for {model!r} in {folder}{suggest(model, logs)}",
                               hint=f"one of: {', '.join(logs) or '(none yet)'}; `vstack logs` alone shows the "
                               "gateway's")
    return logs[model]


def follow(path: Path, start: int, write=sys.stdout.write, poll_s: float = 0.5, stop=lambda: False) -> None:
    """Print what is appended to `path` from byte `start` on; a log truncated (shorter) or replaced (another
    file under the name) is read again from its start, as `tail -F` does."""
    offset = start
    inode = _inode(path)
    while not stop():
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size < offset or _inode(path) != inode:
            offset, inode = 0, _inode(path)
        if size > offset:
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read(size - offset)
            offset += len(chunk)
            write(chunk.decode(errors="replace"))
            sys.stdout.flush()
        time.sleep(poll_s)


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


def logs(
    model: Annotated[str | None, typer.Argument(help="a model's engine log (default: the gateway's)",
                                                       autocompletion=complete.engine_logs)] = None,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new lines until Ctrl-C")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", min=0, help="how many last lines first")] = 50,
    config: ConfigOpt = None,
) -> None:
    """Show the gateway's log, or MODEL's engine log, of what `vstack up` started on this machine."""

    def body() -> int:
        cfg = cli_config()
        path = log_of(cfg.state_dir / "logs", model)
        tail = log_tail(path, lines) if lines else ""
        if tail:
            print(tail, flush=True)
        if follow_:
            try:
                follow(path, os.path.getsize(path))
            except KeyboardInterrupt:
                return ExitCode.OK
        return ExitCode.OK

    run(body)
