"""`vstack up|down|status`: the gateway and the engines it owns, as a background process or in the foreground."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from stack.cli.console_sources import console_sources
from stack.cli.shell import ConfigOpt, cli_config, config_path, err, out, run
from stack.config.schema import StackConfig
from stack.engine.diagnose import log_size, log_tail
from stack.engine.process import stop_process_tree
from stack.engine.records import EngineRecord, RecordStore
from stack.errors import EngineError, ExitCode, ReportedError


def _sample_request(base_url: str, model: str) -> str:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    return f"curl {base_url}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'"


GATEWAY = "gateway"  # the state record of the process `vstack up` leaves running


def _local_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _admin_headers() -> dict[str, str]:
    key = os.environ.get("VSTACK_ADMIN_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _wait_gateway(proc: subprocess.Popen, url: str, timeout: float, log: Path, start: int = 0) -> float:
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
                                              (log_tail(log, 1, start)[-100:], "dim")))
            live.refresh()
            time.sleep(0.5)
    return -1.0


def _start(cfg: StackConfig, profile: str | None, port: int, foreground: bool) -> int:
    """The gateway on the public port, owning the engine (on a free loopback port)."""
    from stack.assemble import plan_engines, serve
    from stack.engine.launch import free_port, port_is_free

    store = RecordStore(cfg.state_dir)
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
        planned = plan_engines(cfg, profile, on_status=lambda s: err.print(f"[dim]{s}[/]"))
        store.save(EngineRecord(GATEWAY, planned.default.resolved.name, os.getpid(), _local_host(host), port, ""))
        out.print(f"  OpenAI base URL: [bold]{url}/v1[/] (engine starting; /ready says when)")
        if cfg.gateway.console:
            out.print(f"  console:         [bold]{url}/ui/[/]")
        out.print("  [dim]running in the foreground; Ctrl-C stops it[/]")
        try:
            return serve(planned, port, console_sources(cfg))
        finally:
            store.remove(GATEWAY)
    failure = cfg.state_dir / "gateway-failure.json"
    failure.unlink(missing_ok=True)
    log = logs / "gateway.log"
    argv = [sys.executable, "-m", "stack.entrypoints.up", *([profile] if profile else []), "--port", str(port),
            "--failure-file", str(failure)]
    if config_path():
        argv += ["--config", str(config_path())]
    start = log_size(log)  # the log is appended to: only this run's lines are ever shown
    with open(log, "ab") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    store.save(EngineRecord(GATEWAY, profile or cfg.serve, proc.pid, _local_host(host), port, str(log), argv))
    try:
        seconds = _wait_gateway(proc, url, cfg.startup_timeout_s + 60, log, start)
    except BaseException:
        stop_process_tree(proc.pid, cfg.stop_grace_s)
        store.remove(GATEWAY)
        raise
    if seconds < 0:
        store.remove(GATEWAY)
        raise _failure(failure, proc.returncode, log, start)
    model = httpx.get(f"{url}/ready", timeout=5).json().get("model", "")
    out.print(f"[green]✓[/] [bold]{model}[/] ready in {seconds:.0f} s behind the gateway")
    out.print(f"  OpenAI base URL: [bold]{url}/v1[/]")
    if cfg.gateway.console:
        out.print(f"  console:         [bold]{url}/ui/[/]" + _console_login(cfg))
    out.print(f"  gateway log:     {log}")
    out.print("  try:")
    out.print(Text("    " + _sample_request(url, model)), soft_wrap=True)
    out.print("  stop with: vstack down")
    return 0


def _console_login(cfg: StackConfig) -> str:
    """How to get in when keys guard the gateway (their names only; never a value)."""
    from stack.gateway.auth import KeyRing

    g = cfg.gateway
    with contextlib.suppress(Exception):
        if KeyRing.from_refs(g.api_keys).enabled or KeyRing.from_refs([g.admin_key] if g.admin_key else []).enabled:
            return "  (log in with the admin key or an API key)"
    return ""


def _failure(failure: Path, returncode: int | None, log: Path, start: int) -> ReportedError | EngineError:
    """What ended the background gateway, with its own exit code (a config error stays 2, a missing model
    4, ...): from the failure file it wrote, else (it crashed) this run's lines of its log."""
    try:
        info = json.loads(failure.read_text())
    except (OSError, ValueError):
        return EngineError(f"the gateway exited with code {returncode}", hint=f"read {log}",
                           log_tail=log_tail(log, start=start))
    return ReportedError(info.get("message") or f"the gateway exited with code {returncode}",
                         hint=info.get("hint"), log_tail=info.get("log_tail") or "",
                         exit_code=int(info.get("exit_code") or returncode or 1))


def up(
    profile: Annotated[str | None, typer.Argument(help="profile or model (default: `serve:` in stack.yaml)")] = None,
    port: Annotated[int | None, typer.Option(help="the gateway's port (default gateway.port); 0 = a free one")] = None,
    foreground: Annotated[bool, typer.Option("--foreground", "-f", help="stay attached; Ctrl-C stops")] = False,
    force: Annotated[bool, typer.Option(help="start even when the fit planner says it will not fit")] = False,
    ray: Annotated[str | None, typer.Option(
        "--ray", metavar="ADDRESS", help="place engines on this Ray cluster (HEAD_IP:6379, or auto): "
        "manager.runtime ray, manager.ray.address ADDRESS")] = None,
    config: ConfigOpt = None,
) -> None:
    """Start the gateway (one OpenAI endpoint) and the engine it owns; wait until the default model is ready."""

    def body() -> int:
        if force:
            os.environ["VSTACK_FIT_CHECK"] = "warn"  # the gateway process it starts reads it too
        if ray:
            os.environ["VSTACK_MANAGER__RUNTIME"] = "ray"
            os.environ["VSTACK_MANAGER__RAY__ADDRESS"] = ray
        cfg = cli_config()
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


def down(name: Annotated[str | None, typer.Argument(help="one engine (default: all)")] = None,
         config: ConfigOpt = None) -> None:
    """Stop what `vstack up` started: the gateway drains, stops its engines; SIGKILL after the grace period."""

    def body() -> int:
        cfg = cli_config()
        store = RecordStore(cfg.state_dir)
        records = [r for r in store.all() if r.name == GATEWAY]  # the one process `vstack up` leaves running
        if not records:
            out.print("nothing is running" if name is None else f"{name!r} is not running")
            return 0 if name is None else 1
        code = 0
        for record in records:
            left = _stop_gateway(record, cfg) if record.alive() else []
            store.remove(record.name)
            if left:
                err.print(f"[red]✗[/] {record.name}: processes {left} did not exit")
                code = ExitCode.ENGINE
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


def status(as_json: Annotated[bool, typer.Option("--json")] = False, config: ConfigOpt = None) -> None:
    """What `vstack up` started: each model behind the gateway, and whether it answers."""

    def body() -> None:
        cfg = cli_config()
        rows = []
        for record in RecordStore(cfg.state_dir).all():
            if record.name == GATEWAY:
                rows += _gateway_rows(record)
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
