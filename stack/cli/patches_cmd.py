"""`vstack patches ...`: a thin shell over stack.patches; the library raises, this prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from stack.cli.every_command import command
from stack.errors import ExitCode
from stack.patches.apply import Patcher, Row, State
from stack.patches.install import find_installation, site_of_python
from stack.patches.ledger import json_schema, load_ledger

app = typer.Typer(help="The vLLM patch ledger: status, apply, revert, verify, and upgrade triage.")
out = Console()
err = Console(stderr=True)

SiteOpt = Annotated[
    Path | None, typer.Option("--site-packages", help="site-packages holding vllm/ (default: this Python's)")
]
PythonOpt = Annotated[Path | None, typer.Option("--python", help="use the vLLM of this interpreter")]
LedgerOpt = Annotated[
    Path | None, typer.Option("--ledger", help="ledger file (default: patches/ledger.yaml)")
]
IdsArg = Annotated[list[str] | None, typer.Argument(help="patch ids (default: all that apply)")]
COLORS = {
    State.APPLIED: "green",
    State.UPSTREAM: "cyan",
    State.RUNTIME: "green",
    State.NOT_NEEDED: "dim",
    State.NOT_APPLIED: "yellow",
    State.CONFLICT: "red",
    State.DRIFTED: "red",
    State.DISABLED: "yellow",
}


def _patcher(site: Path | None, python: Path | None, ledger: Path | None) -> Patcher:
    if python is not None:
        site = site_of_python(python)
    return Patcher(load_ledger(ledger), find_installation(site))


def _table(p: Patcher, rows: list[Row]) -> None:
    t = Table(title=f"patches for {p.inst.describe()}", title_justify="left")
    t.add_column("id", no_wrap=True)
    for col in ("kind", "state", "upstream", "detail"):
        t.add_column(col, overflow="fold")
    for r in rows:
        color = COLORS.get(r.state, "white")
        t.add_row(r.patch.id, r.patch.kind, f"[{color}]{r.state}[/]", r.patch.upstream.cite(), r.detail)
    out.print(t)
    for note in p.notes:
        out.print(f"[yellow]{note}[/]")


@app.command()
@command
def status(
    site: SiteOpt = None, python: PythonOpt = None, ledger: LedgerOpt = None,
    as_json: Annotated[bool, typer.Option("--json", "--as-json", help="the patches' states as JSON")] = False,
) -> None:
    """Each patch as applied, not applied, already upstream, or not needed for the installed vLLM."""
    p = _patcher(site, python, ledger)
    rows = p.status()
    if as_json:
        data = [{"id": r.patch.id, "kind": r.patch.kind, "state": r.state, "detail": r.detail} for r in rows]
        print(json.dumps({"installation": p.inst.describe(), "patches": data}, indent=2))
    else:
        _table(p, rows)


@app.command()
@command
def apply(
    ids: IdsArg = None, site: SiteOpt = None, python: PythonOpt = None, ledger: LedgerOpt = None
) -> None:
    """Apply source patches to the installed vLLM: all or nothing, idempotent."""
    p = _patcher(site, python, ledger)
    rows = p.apply(ids)
    _table(p, rows)


@app.command()
@command
def revert(
    ids: IdsArg = None, site: SiteOpt = None, python: PythonOpt = None, ledger: LedgerOpt = None
) -> None:
    """Take source patches back out, restoring the original bytes."""
    p = _patcher(site, python, ledger)
    rows = p.revert(ids)
    _table(p, rows)


@app.command()
@command
def verify(site: SiteOpt = None, python: PythonOpt = None, ledger: LedgerOpt = None) -> int:
    """Exit 0 only when every patch the installed vLLM needs is in place and unmodified."""
    p = _patcher(site, python, ledger)
    problems = p.verify()
    if problems:
        for prob in problems:
            err.print(f"[red]✗[/] {prob}", highlight=False)
        return ExitCode.PATCH
    out.print(f"[green]✓[/] {p.inst.describe()}: every needed patch is in place")


@app.command()
@command
def schema() -> None:
    """Print the JSON Schema of patches/ledger.yaml."""
    print(json.dumps(json_schema(), indent=2))


def _register_triage() -> None:
    from stack.cli.triage_cmd import triage

    app.command(
        help="Classify upstream changes between two versions (or a git range) into priority buckets."
    )(triage)


_register_triage()
