"""What every `vstack` command shares: the consoles, the --config option, loading it, and turning a
StackError into a red message, its fix and its exit code."""

from __future__ import annotations

from collections.abc import Callable
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

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="your config file or folder "
                                                 "(else $VSTACK_CONFIG)", show_default=False)]


class Invocation:
    """What the top-level callback parsed, for the command that runs after it."""

    config_path: Path | None = None


def cli_config(overrides: dict[str, Any] | None = None) -> StackConfig:
    return load_config(Invocation.config_path, overrides=overrides)


def run(fn: Callable[[], int | None]) -> None:
    """Run a command body: StackErrors become a red message and their exit code, nothing else leaks."""
    try:
        code = fn() or 0
    except StackError as exc:
        err.print(f"[bold red]error:[/] {exc.message}", highlight=False, markup=True, soft_wrap=True)
        if getattr(exc, "log_tail", ""):
            err.print("[dim]--- last engine log lines ---[/]")
            err.print(Text(exc.log_tail))
        if exc.hint:
            err.print(f"[yellow]fix:[/] {exc.hint}", highlight=False)
        raise typer.Exit(exc.exit_code) from None
    raise typer.Exit(code)
