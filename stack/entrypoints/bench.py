"""`python -m stack.entrypoints.bench tune|load|scenarios ...`: the same commands as `vstack tune` / `vstack bench`,
without the rest of the CLI's imports (for machines that carry only vLLM and the stack's core deps)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from stack.cli.bench_cmd import app as bench_app
from stack.cli.tune_cmd import tune_command

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)


@app.callback()
def _root(config: Annotated[Path | None, typer.Option("--config", "-c")] = None) -> None:
    """Load tests and tuning (config: your file or folder, as `vstack --config`)."""


app.command("tune")(tune_command)
app.add_typer(bench_app, name="bench")

if __name__ == "__main__":
    app()
