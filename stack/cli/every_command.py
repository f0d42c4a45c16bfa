"""What every `vstack` command shares: the consoles, the --config option and reading it, and the one
place that turns a StackError into a red message, its fix and its exit code (stack.errors.ExitCode).

`--config` is read the same way by every command: the nearest one given wins, the command's own
(`vstack config validate --config X`) over the root's (`vstack --config X plan M`), else $VSTACK_CONFIG.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from stack.config import load_config
from stack.config.schema import StackConfig
from stack.errors import StackError

out = Console()
err = Console(stderr=True)

class Invocation:
    """What was parsed for the command running now (reset when it ends: tests run many in one process)."""

    config_path: Path | None = None
    url: str | None = None


def _remember_config(value: Path | None) -> Path | None:
    # Options are parsed outermost first: the command's own --config overrides the root's.
    if value is not None:
        Invocation.config_path = value
    return value


ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="your config file or folder "
                                                 "(else $VSTACK_CONFIG)", show_default=False,
                                                 callback=_remember_config)]


def _remember_url(value: str | None) -> str | None:
    if value is not None:
        Invocation.url = value
    return value


UrlOpt = Annotated[str | None, typer.Option(
    "--url", envvar="VSTACK_URL", show_default=False, callback=_remember_url,
    help="a running gateway elsewhere (Compose, another host): http://HOST:PORT (else $VSTACK_URL, else the "
         "one `vstack up` started here); its keys from $VSTACK_API_KEY / $VSTACK_ADMIN_KEY")]


def cli_url() -> str | None:
    """The --url given to this command or the root one, else $VSTACK_URL (stack.manager.client.given_url)."""
    from stack.manager.client import given_url

    return given_url(Invocation.url)


def config_path() -> Path | None:
    """The --config given to this command or to the root command (`vstack --config X plan M`)."""
    return Invocation.config_path


def cli_config(overrides: dict[str, Any] | None = None) -> StackConfig:
    return load_config(config_path(), overrides=overrides)


def report(exc: StackError, prefix: str = "error") -> None:
    """A StackError as the user sees it: the message, the engine's log lines if any, the fix."""
    err.print(f"[bold red]{prefix}:[/] {exc.message}", highlight=False, markup=True, soft_wrap=True)
    if getattr(exc, "log_tail", ""):
        err.print("[dim]--- last engine log lines ---[/]")
        err.print(Text(exc.log_tail))
    if exc.hint:
        err.print(f"[yellow]fix:[/] {exc.hint}", highlight=False)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a `timeout`, a job runner, `kill`) raises KeyboardInterrupt as Ctrl-C does, so the command's
    cleanup runs: engines started in their own sessions would otherwise outlive it."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(fn: Callable[[], int | None], on_error: Callable[[StackError], None] | None = None) -> None:
    """Run a command body and exit with its code: a StackError becomes its message (`on_error` instead,
    when given) and its exit code; nothing else is caught, so a bug still shows its traceback."""
    try:
        code = fn() or 0
    except StackError as exc:
        (on_error or report)(exc)
        sys.exit(exc.exit_code)
    finally:
        Invocation.config_path = None
        Invocation.url = None
    sys.exit(code)


def command(fn: Callable[..., int | None]) -> Callable[..., None]:
    """A Typer command whose body runs under `run` (its signature, hence its options, unchanged)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        run(lambda: fn(*args, **kwargs))

    return wrapper
