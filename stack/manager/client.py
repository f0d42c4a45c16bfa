"""The CLI's side of the model manager: `vstack models`, `switch`, `load`, `unload` call the running
gateway's admin API (with VSTACK_ADMIN_KEY when it is set, else with the admin token the gateway on this
machine wrote to state_dir: stack.manager.admin_token). No printing here: the CLI prints."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from stack.engine.records import RecordStore
from stack.errors import EngineError
from stack.manager import admin_token

GATEWAY = "gateway"  # the state record `vstack up` writes


URL_ENV = "VSTACK_URL"  # a gateway elsewhere (Compose, another host), like ollama's OLLAMA_HOST


def given_url(url: str | None = None) -> str | None:
    """The gateway named by --url, else by $VSTACK_URL (without /v1), else None (the one `vstack up` started)."""
    url = url or os.environ.get(URL_ENV) or None
    if url and "://" not in url:
        url = f"http://{url}"
    return url.rstrip("/").removesuffix("/v1") if url else None


def gateway_url(state_dir: Any, url: str | None = None) -> str:
    """--url / $VSTACK_URL, else the gateway `vstack up` started here."""
    given = given_url(url)
    if given:
        return given
    record = RecordStore(state_dir).get(GATEWAY)
    if record is None or not record.alive():
        raise EngineError("vstack is not running here",
                          hint=f"start it with `vstack up`, or name a running gateway (Compose, another host) "
                          f"with --url http://HOST:PORT or {URL_ENV}")
    return record.base_url


STATE_ENV = "VSTACK_STATE_DIR"
ADMIN_HINT = ("set VSTACK_ADMIN_KEY to the gateway's admin key; without one, run vstack as the user who started "
              "the gateway, with its state_dir (the admin token is read from STATE_DIR/admin-token)")


def default_state_dir() -> Path:
    """Where `vstack up` keeps its state when no config file moves it: $VSTACK_STATE_DIR, else the default."""
    return Path(os.environ.get(STATE_ENV) or Path.home() / ".local" / "state" / "vstack")


def admin_headers(url: str | None = None, state_dir: Any = None) -> dict[str, str]:
    """VSTACK_ADMIN_KEY when set; else, for a gateway on this machine's loopback, the admin token it wrote to
    state_dir (a gateway elsewhere never gets it)."""
    key = os.environ.get("VSTACK_ADMIN_KEY")
    if key:
        return {"Authorization": f"Bearer {key}"}
    if url is not None and not admin_token.for_url(url):
        return {}
    token = admin_token.read(state_dir if state_dir is not None else default_state_dir())
    return {"Authorization": f"Bearer {token}"} if token else {}


def admin(state_dir: Any, method: str, path: str, timeout: float = 10, url: str | None = None,
          body: Any = None, **params: Any) -> dict[str, Any]:
    base = gateway_url(state_dir, url)
    url = base + path
    try:
        resp = httpx.request(method, url, headers=admin_headers(base, state_dir), params=params or None,
                             json=body, timeout=timeout)
    except httpx.TimeoutException as exc:
        raise EngineError(
            f"the gateway did not answer {path} within {timeout:.0f} s",
            hint="the change goes on in the background; watch it with `vstack models`",
        ) from exc
    except httpx.HTTPError as exc:
        raise EngineError(f"the gateway at {url} is not reachable: {type(exc).__name__}") from exc
    try:
        body = resp.json()
    except ValueError:
        body = {}
    if resp.status_code >= 400:
        message = (body.get("error") or {}).get("message") if isinstance(body, dict) else None
        hint = ADMIN_HINT if resp.status_code in (401, 403) else None
        raise AdminError(f"{path}: {resp.status_code} {message or resp.text[:200]}", resp.status_code, hint=hint)
    return body


class AdminError(EngineError):
    """The gateway answered an admin call with an error status (the CLI turns a 404 into did-you-mean)."""

    def __init__(self, message: str, status_code: int, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.status_code = status_code


def model_rows(body: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per model: the manager's view where it has one, else the deployments' summary."""
    rows = []
    for m in body.get("models", []):
        mgr = m.get("manager") or {}
        last = mgr.get("last_switch") or {}
        rows.append({
            "model": m["model"], "state": mgr.get("state") or m["state"], "tier": mgr.get("tier", ""),
            "prefix_cache_gib": mgr.get("prefix_cache_gib") or 0,
            "detail": mgr.get("detail", ""),
            "need_gib": mgr.get("need_gib"), "in_flight": mgr.get("in_flight", 0), "queued": mgr.get("queued", 0),
            "idle_s": mgr.get("idle_s"), "restarts": mgr.get("restarts", 0),
            "last_switch": f"{last['kind']} {last['seconds']:.2f} s" if last else "",
            "log_tail": mgr.get("log_tail", ""), "managed": bool(mgr),
        })  # fmt: skip
    return rows
