"""/ui/*: the console's pages, its JSON calls and its event stream. Thin: each call reuses what the admin
API (stack.gateway.http.admin_routes) and the dispatcher already do.

Who may do what (adr/0018):
- a session cookie (HttpOnly, SameSite=Strict, path /ui) is needed for every page and call; with no key
  configured anywhere it is given on the first page, else by the login form;
- `admin` (the admin key; or, with no admin key, a loopback client, as /admin/* answers) may press the model
  buttons; `viewer` (an API key) reads and uses the playground;
- every POST carries the session's CSRF token in `X-CSRF-Token` and, from a browser, a same-origin `Origin`.
"""

from __future__ import annotations

import asyncio
import hmac
import html
import logging
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field
from starlette.responses import FileResponse, Response

from stack.gateway.console.hub import Hub, TooManyStreams, frame
from stack.gateway.console.live import Series, engine_row, gateway_row
from stack.gateway.console.logs import GatewayLog, follow, tail
from stack.gateway.console.sessions import COOKIE, Session, Sessions
from stack.gateway.console.sources import ConsoleSources, with_bus_floor
from stack.gateway.console.throttle import LoginThrottle
from stack.gateway.endpoints import BY_NAME
from stack.gateway.http.admin_routes import Action, models_view, run_model_action
from stack.gateway.http.auth import local_client
from stack.gateway.http.endpoint_routes import too_many_tokens
from stack.gateway.http.key_routes import (
    NewKey,
    add_named_key,
    end_sessions_of,
    list_named_keys,
    revoke_named_key,
    usage_answer,
)
from stack.gateway.http.relay_response import respond
from stack.gateway.http.route_context import GatewayState, get_state
from stack.gateway.openai_errors import Forbidden, InvalidRequest, ModelNotFound, Unauthorized
from stack.gateway.prom_text import parse
from stack.gateway.registry import Deployment
from stack.gateway.routing.activity import to_csv
from stack.gateway.schemas import ChatCompletionRequest
from stack.gateway.tenants.gate import Caller
from stack.tracing.record import clock

HERE = Path(__file__).parent
log = logging.getLogger("stack.gateway.console")
PAGES = {"models": "Models", "live": "Live", "activity": "Activity", "usage": "Usage", "keys": "Keys",
         "logs": "Logs", "playground": "Playground", "plan": "Plan & config"}  # fmt: skip
SCRAPABLE = ("ready", "sleeping")
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}  # fmt: skip


class Console:
    """What the console keeps: sessions, the event hub, the gateway's log ring, the live series, log offsets."""

    def __init__(self, state: GatewayState, sources: ConsoleSources) -> None:
        self.state, self.sources = state, sources
        self.sessions = Sessions()
        self.throttle = LoginThrottle()
        self.hub = Hub(self.tick)
        self.gateway_log = GatewayLog()
        self.series: dict[str, Series] = {}
        self.log_seq = 0
        self.offsets: dict[str, int] = {}
        self.logs_followed_at = 0.0
        self.activity_seen, self.activity_read_at = 0, 0.0

    # -- the once-a-second sample, while a page listens ----------------------------------------------
    async def tick(self, hub: Hub) -> None:
        if hub.wants("live"):
            hub.publish("live", await self.sample())
        if hub.wants("log"):
            for source, lines in self.new_lines():
                hub.publish("log", {"source": source, "lines": lines})
        if hub.wants("activity"):
            ring = self.state.dispatcher.activity
            if time.monotonic() - self.activity_read_at > 3:  # after a pause: the last seconds only (pages
                self.activity_seen = ring.before(time.time() - 5)  # opening now read the list; they skip twins)
            self.activity_read_at = time.monotonic()
            if rows := ring.since(self.activity_seen):
                self.activity_seen = rows[-1]["id"]
                hub.publish("activity", rows)

    async def sample(self) -> dict[str, Any]:
        state = self.state
        engines = [d for d in state.registry.all() if d.kind == "local" and d.api_base and d.state in SCRAPABLE]
        texts = await asyncio.gather(*(self._scrape(d) for d in engines))
        rows = []
        for dep, text in zip(engines, texts, strict=True):
            series = self.series.setdefault(dep.id, Series())
            if text is not None:
                series.add(parse(text))
            rows.append({"id": dep.id, "model": dep.model_group, "state": dep.state, **engine_row(series)})
        gateway = self.series.setdefault("gateway", Series())
        gateway.add(parse(state.metrics.render().decode()))
        used = state.manager.probe.used() if state.manager is not None else None
        return {"engines": rows, "gateway": gateway_row(gateway),
                "gpu_used_gib": None if used is None else round(used / 2**30, 2)}  # fmt: skip

    async def _scrape(self, dep: Deployment) -> str | None:
        """An engine's /metrics with its key (an engine we started answers 401 without it), read from the
        registry at each sample: a cold start draws a new key and port after the console started."""
        try:
            async with self.state.dispatcher.local.session.get(f"{dep.api_base}/metrics", headers=dep.auth()) as resp:
                return (await resp.read()).decode(errors="replace") if resp.status == 200 else None
        except Exception:
            return None

    def log_files(self) -> dict[str, Path]:
        manager = self.state.manager
        if manager is None:
            return {}
        files = {}
        for name, slot in manager.slots.items():
            path = getattr(slot.runtime.spec, "log_path", None)
            if path:
                files[name] = Path(path)
        return files

    def new_lines(self) -> list[tuple[str, list[str]]]:
        """Lines written since the last tick. After a pause (no Logs page open) following starts again at the
        ends: a page opening later read the tail already (/ui/api/logs)."""
        now, out = time.monotonic(), []
        if now - self.logs_followed_at > 3:
            self.offsets.clear()
            self.log_seq = self.gateway_log.before(time.time() - 5)  # the page skips lines it has
        self.logs_followed_at = now
        self.log_seq, lines = self.gateway_log.since(self.log_seq)
        if lines:
            out.append(("gateway", lines))
        for name, path in self.log_files().items():
            key = str(path)
            if key not in self.offsets:
                self.offsets[key] = size_of(path)
                continue
            self.offsets[key], lines = follow(path, self.offsets[key])
            if lines:
                out.append((name, lines))
        return out

    async def close(self, _state: GatewayState) -> None:
        await self.hub.stop()
        for name in ("", "uvicorn.error"):
            logging.getLogger(name).removeHandler(self.gateway_log)


def size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def install(app: FastAPI, state: GatewayState, sources: ConsoleSources | None = None) -> Console:
    """Mount /ui on `app`; the returned console's `close` goes among the app's shutdown hooks."""
    console = Console(state, sources or ConsoleSources())
    app.state.console = console
    logging.getLogger().addHandler(console.gateway_log)  # the gateway's records (stack.*), wherever they go
    logging.getLogger("uvicorn.error").addHandler(console.gateway_log)  # uvicorn's own does not propagate
    hub = console.hub  # built only when a page listens for it: no page, no cost
    if state.manager is not None:
        state.manager.subscribe(lambda *_: hub.wants("models") and hub.publish("models", models_view(state)))
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="console-static")
    return console


router = APIRouter(prefix="/ui", include_in_schema=False)


def console_of(request: Request) -> Console:
    return request.app.state.console


def login_needed(state: GatewayState) -> bool:
    return (state.keys.enabled or state.admin_keys.enabled or state.admin_token is not None
            or state.dispatcher.tenants.book.enabled)  # fmt: skip


def open_role(state: GatewayState, request: Request) -> str:
    """The role a browser gets without logging in (no key configured for what it asks): admin only where
    /admin/* would answer it without a key or a token (a gateway built in-process, a local client)."""
    local = local_client(request.client.host if request.client else None, request.headers)
    return "admin" if not state.admin_keys.enabled and state.admin_token is None and local else "viewer"


def session_of(request: Request) -> Session | None:
    return console_of(request).sessions.get(request.cookies.get(COOKIE))


def need_session(request: Request) -> Session:
    session = session_of(request)
    if session is None:
        raise Unauthorized("log in to the console first: open /ui/login", code="console_login_required")
    return session


def need_post(request: Request, admin: bool = False) -> Session:
    """A state-changing call: same origin, the session's CSRF token, and (admin) the admin role."""
    session = need_session(request)
    check_origin(request)
    if not session.csrf_ok(request.headers.get("x-csrf-token")):
        raise Forbidden("missing or wrong CSRF token: reload the page and try again", code="csrf_failed")
    if admin and session.role != "admin":
        raise Forbidden("this needs the admin role: log in with the admin key", code="admin_required")
    return session


def check_origin(request: Request) -> None:
    origin = request.headers.get("origin")
    host = request.headers.get("host", "")
    if origin is not None and origin.split("://", 1)[-1] != host:
        raise Forbidden("cross-site request refused", code="cross_site")


def set_cookie(response: Response, request: Request, token: str, ttl_s: float) -> None:
    # Secure over TLS: the request's scheme is https when uvicorn serves TLS, or when a proxy listed in
    # gateway.trusted_proxies says X-Forwarded-Proto: https (uvicorn believes no one else's header).
    response.set_cookie(
        COOKIE,
        token,
        max_age=int(ttl_s),
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def page_html(name: str, session: Session, state: GatewayState) -> str:
    nav = "".join(f'<a href="/ui/{p}"{" aria-current=page" if p == name else ""}>{html.escape(t)}</a>'
                  for p, t in PAGES.items())  # fmt: skip
    text = (HERE / "templates" / "page.html").read_text()
    values = {"title": PAGES[name], "page": name, "nav": nav, "role": session.role, "csrf": session.csrf,
              "who": session.key_name, "login": "1" if login_needed(state) else ""}  # fmt: skip
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value if key == "nav" else html.escape(value, quote=True))
    return text


@router.get("")
async def root() -> RedirectResponse:
    return RedirectResponse("/ui/models", 307)


@router.get("/")
async def index() -> RedirectResponse:
    return RedirectResponse("/ui/models", 307)


@router.get("/login")
async def login_page(request: Request) -> HTMLResponse:
    text = (HERE / "templates" / "login.html").read_text()
    return HTMLResponse(text, headers=HEADERS)


class Login(BaseModel):
    key: str = Field(min_length=1, max_length=4096)


@router.post("/login")
async def login(body: Login, request: Request) -> JSONResponse:
    check_origin(request)
    state, console = get_state(request), console_of(request)
    client = request.client.host if request.client else None
    wait_s = console.throttle.wait_s(client)
    if wait_s:
        return JSONResponse({"error": {"message": f"too many wrong keys from {client}: try again in {wait_s} s",
                                       "type": "rate_limit_error", "param": None, "code": "login_throttled"}},
                            429, headers={"Retry-After": str(wait_s)})  # fmt: skip
    local = local_client(client, request.headers)
    tenant = state.dispatcher.tenants.book.identify(body.key)
    if tenant is not None:  # a named key: its own role (client keys get the viewer role, as API keys do)
        name, role = tenant.name, "admin" if tenant.role == "admin" else "viewer"
    elif (name := state.admin_keys.check(body.key)) is not None:
        role = "admin"
    elif state.admin_token is not None and local and hmac.compare_digest(body.key.encode(), state.admin_token.encode()):
        name, role = "admin-token", "admin"  # no admin key: the token `vstack` reads opens the console too
    elif (name := state.keys.check(body.key)) is not None:
        role = "admin" if not state.admin_keys.enabled and state.admin_token is None and local else "viewer"
    else:
        console.throttle.failed(client)
        raise Unauthorized("Incorrect key: give the admin key or an API key of this gateway", code="invalid_api_key")
    token, _ = console.sessions.create(role, name)  # type: ignore[arg-type]
    log.info("console: key %r logged in as %s from %s", name, role, client)  # the key's name, never the key
    response = JSONResponse({"role": role, "key_name": name})
    set_cookie(response, request, token, console.sessions.ttl_s)
    return response


@router.post("/logout")
async def logout(request: Request) -> JSONResponse:
    need_post(request)
    console_of(request).sessions.drop(request.cookies.get(COOKIE))
    response = JSONResponse({"logged_out": True})
    response.delete_cookie(COOKIE, path="/ui")
    return response


@router.get("/{page}")
async def page(page: str, request: Request) -> Response:
    if page not in PAGES:
        return HTMLResponse(f"<!doctype html><title>Not found</title><p>No console page {html.escape(page)!r}: "
                            '<a href="/ui/models">Models</a></p>', 404, headers=HEADERS)  # fmt: skip
    state, console = get_state(request), console_of(request)
    session, token = session_of(request), None
    if session is None:
        if login_needed(state) and (state.keys.enabled or state.dispatcher.tenants.book.enabled):
            return RedirectResponse(f"/ui/login?next=/ui/{page}", 303)
        # Nothing to log in with for reading: a session for this browser (admin only where /admin/* would be).
        token, session = console.sessions.create(open_role(state, request), "none")  # type: ignore[arg-type]
    response = HTMLResponse(page_html(page, session, state), headers=HEADERS)
    if token:
        set_cookie(response, request, token, console.sessions.ttl_s)
    return response


# -- JSON ------------------------------------------------------------------------------------------------
@router.get("/api/models")
async def api_models(request: Request) -> dict[str, Any]:
    need_session(request)
    state = get_state(request)
    view = models_view(state)
    view["switching"] = state.manager.switching() if state.manager is not None else None
    view["served"] = list(state.model_cards())
    return view


@router.post("/api/models/{model:path}/{action}")
async def api_model_action(model: str, action: str, request: Request) -> dict[str, Any]:
    """Checked in full before anything runs (unknown model, a switch already running); the change itself runs
    in the background and shows on the `models` stream."""
    need_post(request, admin=True)
    state = get_state(request)
    if action not in ("load", "unload", "switch", "sleep"):
        raise InvalidRequest(f"unknown action {action!r}: load, unload, switch or sleep", param="action")
    manager = state.manager
    if manager is None:
        raise InvalidRequest("this gateway has no model manager (it serves fixed deployments)", param="model")
    group = state.routing.resolve(model)
    if not manager.manages(group):
        raise ModelNotFound(f"`{model}` is not a model this gateway starts", param="model")
    running = manager.switching()
    if running is not None and action in ("load", "switch"):
        raise InvalidRequest(f"a switch to `{running}` is running: wait until it ends, then try again",
                             param="model", code="switch_running")  # fmt: skip
    action_: Action = action  # type: ignore[assignment]
    return await run_model_action(state, group, action_, wait=False)


@router.get("/api/activity")
async def api_activity(request: Request, model: str | None = None, status: str | None = None,
                       format: str = "json", limit: int = 200) -> Response:  # fmt: skip
    need_session(request)
    rows = get_state(request).dispatcher.activity.last(model, status, max(1, min(limit, 1000)))
    if format == "csv":
        return PlainTextResponse(
            to_csv(rows), media_type="text/csv", headers={"Content-Disposition": "attachment; filename=activity.csv"}
        )
    if format != "json":
        raise InvalidRequest("format must be json or csv", param="format")
    return JSONResponse({"requests": rows})


@router.get("/api/trace/{request_id}")
async def api_trace(request_id: str, request: Request) -> dict[str, Any]:
    """One request's spans for the Activity page's waterfall: by the Activity log's request id or its trace id
    (kept in memory for the last observability.tracing.keep requests; adr/0042)."""
    need_session(request)
    tracer = get_state(request).dispatcher.tracer
    if tracer is None or tracer.buffer is None:
        raise ModelNotFound("request timelines are off: set observability.tracing.keep to the number of requests "
                            "to keep (e.g. 500), or turn tracing on (observability.tracing.endpoint)",
                            code="tracing_off")  # fmt: skip
    found = tracer.buffer.get(request_id)
    if found is None:
        raise ModelNotFound(f"no timeline kept for request {request_id}: the gateway keeps the last "
                            f"{tracer.buffer.size}; raise observability.tracing.keep to keep more",
                            code="trace_not_found")  # fmt: skip
    switch = next((s["attributes"].get("vstack.switch.trace_id") for s in found["spans"]
                   if s["attributes"].get("vstack.switch.trace_id")), None)  # fmt: skip
    kept = tracer.buffer.get(switch) if switch else None
    if kept is not None:  # the switch it waited for: a trace of its own, placed on this request's clock
        offset = (kept["start_ns"] - found["start_ns"]) / 1e6
        found["switch"] = [{**s, "start_ms": round(s["start_ms"] + offset, 3)} for s in kept["spans"]]
    return found


@router.get("/api/usage")
async def api_usage(request: Request, format: str = "json", minutes: int = 60) -> Response:
    """The Usage page's data: every tenant for the admin role and viewer keys; a client key's own only."""
    session = need_session(request)
    state = get_state(request)
    tenant = state.dispatcher.tenants.book.by_name.get(session.key_name)
    only = tenant.name if tenant is not None and tenant.role == "client" else None
    return usage_answer(state, format, only, minutes)


@router.get("/api/keys")
async def api_keys(request: Request) -> dict[str, Any]:
    """The Keys page: every named key with its limits and what it used; the admin role only (as /admin/keys)."""
    session = need_session(request)
    if session.role != "admin":
        raise Forbidden("the named keys are shown to the admin role only: log in with the admin key",
                        code="admin_required")  # fmt: skip
    return list_named_keys(get_state(request))


@router.post("/api/keys", status_code=201)
async def api_add_key(spec: NewKey, request: Request) -> dict[str, Any]:
    """Add a named key as POST /admin/keys does; the key drawn is in this answer only (the page shows it once)."""
    session = need_post(request, admin=True)
    if spec.replace or spec.rotate or spec.sha256 is not None:  # the page adds new keys only; the CLI does the rest
        raise InvalidRequest("the console adds new keys only: change or rotate one with `vstack keys add NAME "
                             "--replace`", param="replace", code="console_add_only")  # fmt: skip
    answer = add_named_key(get_state(request), spec)
    log.info("console: named key %r (role %s) added by %r", spec.name, spec.role, session.key_name)
    return answer


@router.post("/api/keys/{name}/revoke")
async def api_revoke_key(name: str, request: Request) -> dict[str, Any]:
    session = need_post(request, admin=True)
    answer = revoke_named_key(get_state(request), name)
    end_sessions_of(request, name)
    log.info("console: named key %r revoked by %r", name, session.key_name)
    return answer


@router.get("/api/logs")
async def api_logs(request: Request, source: str = "gateway", lines: int = 200) -> dict[str, Any]:
    need_session(request)
    console = console_of(request)
    files = console.log_files()
    sources = ["gateway", *files]
    if source == "gateway":
        text = [line for _, line in list(console.gateway_log.lines)][-lines:]
    elif source in files:
        text = tail(files[source], max(1, min(lines, 1000)))[1]
    else:
        raise InvalidRequest(f"no log {source!r}: one of {', '.join(sources)}", param="source")
    return {"source": source, "sources": sources, "lines": text}


@router.get("/api/live")
async def api_live(request: Request) -> dict[str, Any]:
    need_session(request)
    return await console_of(request).sample()


@router.get("/api/plan")
async def api_plan(request: Request) -> dict[str, Any]:
    need_session(request)
    console, state = console_of(request), get_state(request)
    s = console.sources

    async def call(f):  # the ledger reads vLLM's files, the reports scan results/: off the event loop
        return None if f is None else await asyncio.to_thread(f)

    manager = state.manager
    return {
        "config": await call(s.config), "engines": await call(s.engines), "patches": await call(s.patches),
        "reports": await call(s.reports),
        "switches": [with_bus_floor(x, s.bus_h2d_gbps) for x in reversed(manager.history)] if manager else [],
        "decisions": manager.decisions if manager is not None else [],
        "manager": {k: v for k, v in manager.status().items() if k not in ("models", "decisions")} if manager else None,
    }  # fmt: skip


@router.get("/api/reports/{index}/{name}")
async def api_report_file(index: int, name: str, request: Request) -> Response:
    """A report's plot (PNG), only from the folders the report list names."""
    need_session(request)
    dirs = console_of(request).sources.report_dirs
    folders = dirs() if dirs is not None else []
    if not 0 <= index < len(folders) or "/" in name or not name.endswith(".png"):
        raise ModelNotFound(f"no plot {name!r} in report {index}", code="not_found")
    path = folders[index] / name
    if not path.is_file():
        raise ModelNotFound(f"no plot {name!r} in report {index}", code="not_found")
    return FileResponse(path, media_type="image/png")


@router.post("/api/chat")
async def api_chat(req: ChatCompletionRequest, request: Request) -> Response:
    """The playground: the gateway's own dispatcher answers (the request shows in Activity like any other)."""
    session = need_post(request)
    state = get_state(request)
    refusal = too_many_tokens(state, BY_NAME["chat"], await request.json())  # the same limits as /v1
    if refusal is not None:
        raise refusal
    tenant = state.dispatcher.tenants.book.by_name.get(session.key_name)  # a named key's limits hold here too
    if tenant is not None and tenant.role == "viewer":
        raise Forbidden(
            f"key {tenant.name!r} is a viewer key: it reads the console, it does not send requests", code="viewer_key"
        )
    dispatcher = state.dispatcher
    trace = dispatcher.trace("chat", clock(), None) if dispatcher.tracer is not None else None
    return respond(await dispatcher.handle("chat", await request.json(), trace, Caller(session.key_name, tenant)))


@router.get("/api/events")
async def api_events(request: Request, topics: str = "models") -> Response:
    session = need_session(request)
    hub = console_of(request).hub
    try:
        client = hub.open(request.cookies.get(COOKIE, ""), set(topics.split(",")), session.role)
    except TooManyStreams as exc:
        return JSONResponse({"error": {"message": str(exc), "type": "rate_limit_error", "code": "too_many_streams"}},
                            429, headers={"Retry-After": "5"})  # fmt: skip
    state = get_state(request)
    first = [("models", models_view(state))] if "models" in client.topics else []

    async def stream():
        try:
            yield b"retry: 3000\n\n"
            for topic, data in first:
                yield frame(topic, data)
            while console_of(request).sessions.get(request.cookies.get(COOKIE)) is session:
                try:
                    raw = await asyncio.wait_for(client.queue.get(), 15)
                except TimeoutError:
                    raw = b": keep-alive\n\n"
                if not raw:  # the gateway is stopping (Hub.end_streams)
                    return
                yield raw
        finally:
            hub.close(client)

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
