"""`vstack status`: what runs, behind the gateway `vstack up` started, a gateway elsewhere (--url), or a Compose
deployment's on this host; each model's state and what the gateway reports about itself."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.table import Table

from stack.cli.every_command import ConfigOpt, UrlOpt, cli_config, cli_url, err, out, run
from stack.cli.lifecycle import GATEWAY, _admin_headers, _local_host
from stack.engine.kept import (
    leftovers,
)
from stack.engine.records import EngineRecord, RecordStore


def _gateway_rows(record: EngineRecord, state_dir: Path) -> list[dict]:
    base = {
        "profile": record.profile,
        "pid": record.pid,
        "url": f"{record.base_url}/v1",
        "uptime_s": round(time.time() - record.started_at),
        "log": record.log_path,
    }
    if not record.alive():
        return [{"name": GATEWAY, "state": "dead", **base}]
    return _model_rows(record.base_url, base, state_dir) or [{"name": GATEWAY, "state": "starting", **base}]


def _model_rows(base_url: str, base: dict, state_dir: Path) -> list[dict]:
    try:
        reply = httpx.get(f"{base_url}/admin/models", headers=_admin_headers(base_url, state_dir), timeout=3)
        if reply.status_code in (401, 403):  # it answers, but not to us: say so instead of "starting"
            return [{"name": GATEWAY, "state": "answers (admin key needed to list its models)", **base,
                     "warnings": [_refused(reply)]}]  # fmt: skip
        answer = reply.json()
        models = answer["models"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return []
    warnings = _warnings(answer.get("gateway") or {})
    return [{"name": m["model"], "state": (m.get("manager") or {}).get("state") or m["state"], **base,
             "deployments": [d["id"] for d in m["deployments"]], **({"warnings": warnings} if warnings else {})}
            for m in models]  # fmt: skip


def _refused(reply: httpx.Response) -> str:
    try:
        said = reply.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        said = reply.text[:200]
    given = (
        "the key in VSTACK_ADMIN_KEY was refused"
        if os.environ.get("VSTACK_ADMIN_KEY")
        else "VSTACK_ADMIN_KEY is not set"
    )
    return (
        f"the gateway at {reply.request.url.scheme}://{reply.request.url.netloc.decode()} refused /admin "
        f"({reply.status_code}: {said}); {given}: export VSTACK_ADMIN_KEY=<the gateway's admin key>"
    )


def _warnings(gateway: dict) -> list[str]:
    """What the gateway reports about itself: log lines a full disk lost, engines that stopped answering,
    /admin changes restored from (or not persisted to) state_dir."""
    out = []
    log = gateway.get("log")
    if log:
        out.append(f"the gateway lost {log['lines_lost']} log lines since {log['since']}: {log['error']}")
    out += [f"engine {dep} is unresponsive: {why}" for dep, why in (gateway.get("unresponsive") or {}).items()]
    runtime = gateway.get("runtime_state") or {}
    out += [f"runtime change not restored: {s['what']}: {s['why']}" + (f" (remove it: {s['remove']})"
            if s.get("remove") else "") for s in runtime.get("skipped") or []]  # fmt: skip
    if runtime.get("write_error"):
        out.append(f"runtime changes are not persisted: {runtime['write_error']}")
    if runtime.get("restored"):
        out.append(f"restored at start from {runtime['path']}: {', '.join(runtime['restored'])}")
    return out


def _remote_rows(url: str, state_dir: Path) -> list[dict]:
    """A gateway this machine did not start (Compose, another host): its models, no pid or log here."""
    base = {"profile": "-", "pid": None, "url": f"{url}/v1", "uptime_s": None, "log": "-"}
    try:
        health = httpx.get(f"{url}/health", timeout=3)
    except httpx.HTTPError:
        return []
    if health.status_code != 200:
        return []
    rows = _model_rows(url, base, state_dir)
    if rows:
        return rows
    return [{"name": GATEWAY, "state": "answers (set VSTACK_ADMIN_KEY to list its models)", **base}]


def status(
    as_json: Annotated[bool, typer.Option("--json")] = False, url: UrlOpt = None, config: ConfigOpt = None
) -> None:
    """What runs: each model behind the gateway `vstack up` started, else behind --url / $VSTACK_URL, else
    behind a gateway on this host's gateway.port (a Compose deployment)."""

    def body() -> None:
        cfg = cli_config()
        given = cli_url()
        rows = []
        if given is None:
            for record in RecordStore(cfg.state_dir).all():
                if record.name == GATEWAY:
                    rows += _gateway_rows(record, cfg.state_dir)
            for record in leftovers(cfg.state_dir):  # engines whose gateway is gone (killed, --keep-engines, down)
                state = (f"kept asleep (level {record.asleep}, {record.host_bytes / 2**30:.1f} GiB host RAM)"
                         if record.asleep else "kept (no gateway)")  # fmt: skip
                rows.append(
                    {
                        "name": record.name,
                        "profile": record.profile,
                        "state": state,
                        "pid": record.pid,
                        "url": f"{record.base_url}/v1",
                        "uptime_s": round(time.time() - record.started_at),
                        "log": record.log_path,
                    }
                )
        if not rows and (given or cfg.gateway.port):  # port 0 (a free one each time): nothing to look for
            rows = _remote_rows(given or f"http://{_local_host(cfg.gateway.host)}:{cfg.gateway.port}", cfg.state_dir)
        if as_json:
            out.print_json(data=rows)
            return
        if not rows:
            where = f" at {given}" if given else ""
            out.print(f"nothing is running{where} (start with `vstack up`; a gateway elsewhere: --url or VSTACK_URL)")
            return
        table = Table(title="vstack")
        table.add_column("name", overflow="fold", min_width=12)
        table.add_column("state", overflow="fold")
        table.add_column("pid", no_wrap=True)
        table.add_column("url", overflow="fold", min_width=26)
        table.add_column("uptime", no_wrap=True)
        colour = {
            "ready": "green",
            "starting": "yellow",
            "dead": "red",
            "unavailable": "red",
            "failed": "red",
            "kept (no gateway)": "yellow",
        }
        for r in rows:
            uptime = "-" if r["uptime_s"] is None else f"{r['uptime_s']} s"
            shade = "yellow" if r["state"].startswith("kept") else colour.get(r["state"], "white")
            table.add_row(r["name"], f"[{shade}]{r['state']}[/]", str(r["pid"] or "-"), r["url"], uptime)
        out.print(table)
        logs = sorted({r["log"] for r in rows if r["log"] not in ("-", "")})
        for log in logs:
            out.print(f"log: {log}  (`vstack logs` shows it)", soft_wrap=True, highlight=False)
        for warning in dict.fromkeys(w for r in rows for w in r.get("warnings", [])):
            kind = "[dim]note:[/]" if warning.startswith("restored at start") else "[yellow]warning:[/]"
            err.print(f"{kind} {warning}")

    run(body)
