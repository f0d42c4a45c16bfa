"""`vstack up|down|reload`: the gateway and the engines it owns, as a background process or in the foreground
(`vstack status`: stack.cli.status_cmd)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import httpx
import typer
from rich.live import Live
from rich.text import Text

from stack.cli import gateway_process
from stack.cli.complete import profiles_and_models
from stack.cli.console_sources import console_sources
from stack.cli.every_command import ConfigOpt, cli_config, config_path, err, out, run
from stack.cli.progress import StartProgress
from stack.config.schema import StackConfig
from stack.config.state_dir import check_state_dir
from stack.engine import early_spawn
from stack.engine.diagnose import log_size, log_tail
from stack.engine.kept import (
    DOWN_REPORT,
    KEEP_ASLEEP_FLAG,
    KEEP_FLAG,
    kept_asleep,
    leftovers,
    read_down_report,
    stop_leftovers,
    tree_pids,
)
from stack.engine.launch import early_payload
from stack.engine.process import stop_process_tree
from stack.engine.records import EngineRecord, RecordStore, engine_records
from stack.engine_env import child_argv
from stack.errors import AlreadyRunningError, EngineError, ExitCode, PortInUseError, ReportedError
from stack.planner.stack_planner import unconfigured_line

if TYPE_CHECKING:
    import psutil


def key_variable(cfg: StackConfig) -> str | None:
    """The variable a client's key is shown as when /v1 keys are on (None: no key needed): the one that
    holds the first key set, else VSTACK_API_KEY (hashed keys: the client has its key somewhere)."""
    refs = [k for k in cfg.gateway.api_keys if k.sha256 or (k.env and os.environ.get(k.env))]
    if not refs:
        return None
    return next((k.env for k in refs if k.env), "VSTACK_API_KEY")


def _sample_request(base_url: str, model: str, key_env: str | None = None) -> str:
    """A curl that answers in a sentence: temperature 0 and a token cap (a 135M model sampled at the default
    temperature rambles for minutes); the key as $VARIABLE when keys are on, never its value."""
    body = json.dumps({"model": model, "temperature": 0, "max_tokens": 64,
                       "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    auth = f' -H "Authorization: Bearer ${key_env}"' if key_env else ""
    return f"curl {base_url}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'"


GATEWAY = "gateway"  # the state record of the process `vstack up` leaves running


def _local_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _admin_headers(url: str, state_dir: Path) -> dict[str, str]:
    from stack.manager.client import admin_headers

    return admin_headers(url, state_dir)


def _wait_gateway(proc: subprocess.Popen, url: str, timeout: float, log: Path, start: int = 0,
                  state_dir: Path | None = None, progress: StartProgress | None = None) -> float:  # fmt: skip
    """Seconds until /ready answers 200 (the default model's engine is up), or -1 if the process ended.
    Shows the start's phases (stack.cli.progress) as it goes, after the planning `progress` showed."""
    started = time.monotonic()
    progress = progress or StartProgress(err, log, start, state_dir or log.parent.parent, proc.pid)
    progress.owner = proc.pid
    with Live(progress.spinner, console=err, transient=True, refresh_per_second=8) as live, \
            httpx.Client(timeout=2) as http:
        while proc.poll() is None:
            elapsed = time.monotonic() - started
            if elapsed > timeout:
                raise EngineError(f"the gateway was not ready after {timeout:.0f} s", hint=f"read {log}")
            try:
                if http.get(f"{url}/ready").status_code == 200:
                    progress.enter("ready")
                    return elapsed
            except httpx.HTTPError:
                pass
            live.update(progress.poll(elapsed))
            time.sleep(POLL_S)
    return -1.0


POLL_S = 0.1  # readiness polls: a start is seen ready within this (0.5 s before: a quarter of a second lost)


def _start(cfg: StackConfig, profile: str | None, port: int, foreground: bool,
           overrides: dict | None = None) -> int:  # fmt: skip
    """The gateway on the public port, owning the engine (on a free loopback port). Planned here, once: the
    gateway process this starts (background) is handed the plan, and plans nothing itself."""
    from stack.assemble.gateways import serve
    from stack.assemble.planning import Launch, plan_up
    from stack.engine.launch import port_is_free
    from stack.engine.ports import free_port

    check_state_dir(cfg)  # before anything is written there: a clear error, not a traceback
    store = RecordStore(cfg.state_dir)
    existing = store.get(GATEWAY)
    if existing and existing.alive():
        raise AlreadyRunningError(f"vstack is already running (pid {existing.pid}, {existing.base_url})",
                                  hint="`vstack down` first, or `vstack status`")
    if existing:
        store.remove(GATEWAY)
    host = cfg.gateway.host
    port = port or free_port()
    if not port_is_free(host, port):
        raise PortInUseError(f"port {port} on {host} is in use", hint="stop what uses it, or `vstack up --port 0`")
    url = f"http://{_local_host(host)}:{port}"
    logs = cfg.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    plan_file = cfg.state_dir / PLAN_FILE
    if foreground:
        plan = plan_up(cfg, profile, on_status=lambda s: err.print(f"[dim]{s}[/]"), overrides=overrides)
        plan.save(plan_file)
        store.save(EngineRecord(GATEWAY, plan.default.profile, os.getpid(), _local_host(host), port, ""))
        out.print(f"  OpenAI base URL: [bold]{url}/v1[/] (engine starting; /ready says when)")
        if cfg.gateway.console:
            out.print(f"  console:         [bold]{url}/ui/[/]")
        out.print("  [dim]running in the foreground; Ctrl-C stops it[/]")
        try:
            return serve(Launch(plan), port, reload_from=(profile, str(config_path()) if config_path() else None),
                         console=console_sources(cfg))
        finally:
            store.remove(GATEWAY)
    failure = cfg.state_dir / "gateway-failure.json"
    failure.unlink(missing_ok=True)
    log = logs / "gateway.log"
    start = log_size(log)  # the log is appended to: only this run's lines are ever shown
    progress = StartProgress(err, log, start, cfg.state_dir, 0)
    with Live(progress.spinner, console=err, transient=True, refresh_per_second=8) as live:
        began = time.monotonic()

        def planning(line: str) -> None:
            live.update(progress.said(line, time.monotonic() - began))

        plan = plan_up(cfg, profile, on_status=planning, overrides=overrides)
        progress.planned_s = time.monotonic() - began
    plan.save(plan_file)
    argv = child_argv(sys.executable, gateway_process, "--plan", str(plan_file), "--secrets-stdin",
                      *([profile] if profile else []), "--port", str(port), "--failure-file", str(failure))
    if config_path():  # not read at start: `vstack reload` reads it again
        argv += ["--config", str(config_path())]
    with open(log, "ab") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                                start_new_session=True)
    # On its stdin, never in a file or its environment: the plan's secrets (key digests, the Hub token) and the
    # default engine's spec with its key, for the gateway to spawn before its imports (stack.engine.early_spawn).
    handed = {"secrets": plan.secrets(), early_spawn.KEY: early_payload(plan, cfg)}
    try:
        proc.stdin.write(json.dumps(handed).encode())  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
    except BrokenPipeError:  # it ended already: its failure file or log says why (below)
        pass
    store.save(EngineRecord(GATEWAY, profile or cfg.serve, proc.pid, _local_host(host), port, str(log), argv))
    try:
        seconds = _wait_gateway(proc, url, cfg.startup_timeout_s + 60, log, start, cfg.state_dir, progress)
    except BaseException:
        stop_process_tree(proc.pid, cfg.stop_grace_s)
        store.remove(GATEWAY)
        raise
    if seconds < 0:
        store.remove(GATEWAY)
        raise _failure(failure, proc.returncode, log, start)
    seconds += progress.planned_s
    model = httpx.get(f"{url}/ready", timeout=5).json().get("model", "")
    out.print(f"[green]✓[/] [bold]{model}[/] ready in {seconds:.0f} s behind the gateway")
    out.print(f"  OpenAI base URL: [bold]{url}/v1[/]")
    if cfg.gateway.console:
        out.print(f"  console:         [bold]{url}/ui/[/]" + _console_login(cfg))
    out.print(f"  gateway log:     {log}")
    for line in (unconfigured_line(m) for m in plan.models if m.ad_hoc):
        out.print(Text(f"  {line}"), soft_wrap=True)
    out.print("  try:")
    out.print(Text("    " + _sample_request(url, model, key_variable(cfg))), soft_wrap=True)
    out.print("  stop with: vstack down")
    return 0


PLAN_FILE = "plan.json"  # what the last `vstack up` decided (stack.planner.plans), mode 0600


def _console_login(cfg: StackConfig) -> str:
    """How to get in when keys guard the gateway (their names only; never a value)."""
    from stack.gateway.http.auth import KeyRing

    g = cfg.gateway
    with contextlib.suppress(Exception):
        if KeyRing.from_refs([g.admin_key] if g.admin_key else []).enabled:
            return "  (log in with the admin key or an API key)"
        # no admin key: /admin and the console's buttons take the admin token this start wrote (adr/0039)
        return f"  (admin: log in with the token in {cfg.state_dir / 'admin-token'})"
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
    profile: Annotated[str | None, typer.Argument(
        help="profile, model, Hugging Face Hub id (org/name) or model folder (default: `serve:` in stack.yaml)",
        autocompletion=profiles_and_models)] = None,
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
        # Over the configuration, as the command line always is; recorded in the plan (a reload applies them).
        overrides: dict = {"fit_check": "warn"} if force else {}
        if ray:
            overrides["manager"] = {"runtime": "ray", "ray": {"address": ray}}
        cfg = cli_config(overrides or None)
        return _start(cfg, profile, cfg.gateway.port if port is None else port, foreground, overrides)

    run(body)


def _stop_gateway(record: EngineRecord, cfg: StackConfig, keep_engines: bool = False,
                  keep_asleep: bool = False) -> list[int]:  # fmt: skip
    """SIGTERM lets the gateway drain and stop its engines; whatever is left after that is killed. With
    keep_engines the gateway leaves its engines running (their records stay) for the next `up` to re-attach;
    with keep_asleep it puts those with sleep mode to sleep and leaves them so (adr/0030)."""
    import psutil

    try:
        root = psutil.Process(record.pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    if keep_engines:
        engines = set().union(*(tree_pids(r.pid) for r in engine_records(cfg.state_dir).all() if r.alive()))
        family = [p for p in family if p.pid not in engines]
        (cfg.state_dir / KEEP_FLAG).write_text("")
    elif keep_asleep:
        (cfg.state_dir / KEEP_ASLEEP_FLAG).write_text("")
    (cfg.state_dir / DOWN_REPORT).unlink(missing_ok=True)  # only what this shutdown reports is shown
    os.kill(record.pid, signal.SIGTERM)
    with contextlib.suppress(psutil.NoSuchProcess, psutil.TimeoutExpired):  # a sleep takes seconds: its bound too
        psutil.Process(record.pid).wait(cfg.gateway.drain_grace_s + cfg.stop_grace_s + 10 + 120 * keep_asleep)
    (cfg.state_dir / KEEP_FLAG).unlink(missing_ok=True)
    (cfg.state_dir / KEEP_ASLEEP_FLAG).unlink(missing_ok=True)
    if keep_asleep:  # the engines it put to sleep are left alone; every other process of its tree goes
        asleep = set().union(*(tree_pids(r.pid) for r in kept_asleep(cfg.state_dir)))
        family = [p for p in family if p.pid not in asleep]
    return stop_what_is_left(family)


def stop_what_is_left(family: list[psutil.Process]) -> list[int]:
    """Stop what is left of a stopped gateway's tree: only the processes still the ones seen before it was
    stopped. A pid freed meanwhile may already name another process (pid_max is 32768 on many hosts, and a busy
    one wraps it): psutil's `is_running` compares creation times, where a bare pid would signal a stranger and
    its whole process group."""
    left: list[int] = []
    for proc in family:
        left += stop_process_tree(proc.pid, 5) if proc.is_running() else []
    return left


def down(name: Annotated[str | None, typer.Argument(help="one engine (default: all)")] = None,
         keep_engines: Annotated[bool, typer.Option(
             "--keep-engines", help="stop the gateway only: its engines keep serving (and holding their memory) "
             "until the next `vstack up` re-attaches them or `vstack down` stops them")] = False,
         everything: Annotated[bool, typer.Option(
             "--all", help="stop every engine, those kept running or asleep included, and release their memory "
             "(plain `vstack down` keeps engines with sleep mode asleep: manager.down_keeps_asleep)")] = False,
         config: ConfigOpt = None) -> None:
    """Stop what `vstack up` started: the gateway drains and stops its engines (SIGKILL after the grace period);
    GPU engines with sleep mode are put to sleep and kept, holding host RAM, for the next `vstack up` to wake
    in seconds (manager.down_keeps_asleep; `--all` stops them too). Engines a killed gateway left are stopped."""

    def body() -> int:
        if keep_engines and everything:
            raise typer.BadParameter("--keep-engines keeps the engines running and --all stops them: give one",
                                     param_hint="--keep-engines / --all")  # fmt: skip
        cfg = cli_config()
        keep_asleep = cfg.manager.down_keeps_asleep and not everything and not keep_engines
        store = RecordStore(cfg.state_dir)
        records = [r for r in store.all() if r.name == GATEWAY]  # the one process `vstack up` leaves running
        orphans = [] if keep_engines else [r for r in leftovers(cfg.state_dir) if not (keep_asleep and r.asleep)]
        if not records and not orphans:
            if keep_asleep and kept_asleep(cfg.state_dir):
                _say_kept_asleep(cfg)
                return 0
            out.print("nothing is running" if name is None else f"{name!r} is not running")
            return 0 if name is None else 1
        code = 0
        for record in records:
            left = _stop_gateway(record, cfg, keep_engines, keep_asleep) if record.alive() else []
            store.remove(record.name)
            if left:
                err.print(f"[red]✗[/] {record.name}: processes {left} did not exit")
                code = ExitCode.ENGINE
            else:
                out.print(f"[green]✓[/] stopped {record.name}")
        for note in read_down_report(cfg.state_dir):  # what it stopped and why (the kept ones are listed below)
            if ": kept asleep (" not in note:
                out.print(Text(f"  {note}"), soft_wrap=True)
        if keep_engines:
            for kept in engine_records(cfg.state_dir).all():
                if kept.alive():
                    out.print(f"  kept engine {kept.name} (pid {kept.pid}): `vstack up` re-attaches it, "
                              "`vstack down` stops it")  # fmt: skip
            return code
        spare = frozenset(r.name for r in kept_asleep(cfg.state_dir)) if keep_asleep else frozenset()
        stopped, left = stop_leftovers(cfg.state_dir, cfg.stop_grace_s, spare)
        for record in stopped:
            how = "kept asleep" if record.asleep else "left by a gateway that is gone"
            out.print(f"[green]✓[/] stopped engine {record.name} (pid {record.pid}), {how}")
        if left:
            err.print(f"[red]✗[/] engine processes {left} did not exit")
            code = ExitCode.ENGINE
        if keep_asleep:
            _say_kept_asleep(cfg)
        return code

    run(body)


def _say_kept_asleep(cfg: StackConfig) -> None:
    """What a plain `vstack down` kept asleep, the host RAM it holds, and how to release it (adr/0030)."""
    kept = kept_asleep(cfg.state_dir)
    for record in kept:
        out.print(f"  kept asleep: {record.name} (pid {record.pid}, sleep level {record.asleep}), "
                  f"{record.host_bytes / 2**30:.1f} GiB of host RAM", soft_wrap=True)  # fmt: skip
    if kept:
        held = sum(r.host_bytes for r in kept) / 2**30
        out.print(f"  {len(kept)} engine(s) kept asleep, holding {held:.1f} GiB of host RAM (GPU memory freed but "
                  "their CUDA context): `vstack up` wakes them in seconds; `vstack down --all` releases them",
                  soft_wrap=True)  # fmt: skip


def reload(config: ConfigOpt = None) -> None:
    """Read the configuration again: engines whose rendered command changed restart (each after its
    requests drain), the others keep serving; waits until the restarted ones are ready."""

    def body() -> int:
        cfg = cli_config()  # a broken file stops here, before the running gateway is asked anything
        record = RecordStore(cfg.state_dir).get(GATEWAY)
        if record is None or not record.alive():
            raise EngineError("vstack is not running", hint="start it with `vstack up`")
        started = time.monotonic()
        try:
            resp = httpx.post(f"{record.base_url}/admin/reload", headers=_admin_headers(record.base_url, cfg.state_dir),
                              timeout=cfg.startup_timeout_s)  # fmt: skip
        except httpx.HTTPError as exc:
            raise EngineError(f"the gateway at {record.base_url} did not answer: {type(exc).__name__}") from exc
        if resp.status_code != 200:
            try:
                message = resp.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = resp.text[:300]
            raise EngineError(f"reload refused ({resp.status_code}): {message}",
                              hint="nothing was changed; the running engines keep serving")  # fmt: skip
        done = resp.json()
        for name in done["kept"]:
            out.print(f"[green]✓[/] {name}: unchanged, kept serving")
        for line in done["not_applied"]:
            err.print(f"[yellow]![/] {line}")
        code = 0
        for name in done["restarted"]:
            state, detail = _wait_model(record.base_url, name, cfg.startup_timeout_s + 60, cfg.state_dir)
            if state == "ready":
                out.print(f"[green]✓[/] {name}: command changed, restarted ({detail}); "
                          f"{time.monotonic() - started:.1f} s since the reload")  # fmt: skip
            else:
                err.print(f"[red]✗[/] {name}: {state}: {detail}")
                code = ExitCode.ENGINE
        return code

    run(body)


def _wait_model(base_url: str, name: str, timeout: float, state_dir: Path) -> tuple[str, str]:
    """Poll /admin/models until `name` is ready or failed (a restart first passes through stopping)."""
    deadline, seen_down = time.monotonic() + timeout, False
    with Live(Text(f"{name}: restarting"), console=err, transient=True) as live, httpx.Client(timeout=5) as http:
        while time.monotonic() < deadline:
            try:
                models = http.get(f"{base_url}/admin/models",
                                  headers=_admin_headers(base_url, state_dir)).json()["models"]
                entry = next(m for m in models if m["model"] == name)
                model = entry.get("manager") or entry  # the manager's state: stopping, starting, ready, failed
            except (httpx.HTTPError, ValueError, KeyError, StopIteration):
                model = {"state": "unknown", "detail": ""}
            state, detail = model["state"], model.get("detail", "")
            seen_down = seen_down or state != "ready"
            if seen_down and state in ("ready", "failed"):
                return state, detail
            live.update(Text.assemble((f"{name}: ", "bold"), (f"{state} ", "cyan"), (str(detail)[-100:], "dim")))
            time.sleep(POLL_S)
    return "timeout", f"not ready after {timeout:.0f} s"
