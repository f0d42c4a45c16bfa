"""/ui/api/*: the JSON calls the pages make and their one event stream. Thin: each call reuses what the admin
API (stack.gateway.http.admin_routes, key_routes) and the dispatcher already do, after the console's own
session checks (stack.gateway.console.access)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.responses import FileResponse, Response

from stack.gateway.console.access import console_of, need_post, need_session
from stack.gateway.console.hub import TooManyStreams, frame
from stack.gateway.console.logs import tail
from stack.gateway.console.sessions import COOKIE
from stack.gateway.console.sources import with_bus_floor
from stack.gateway.endpoints import BY_NAME
from stack.gateway.http.admin_routes import Action, managed, models_view, run_model_action
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
from stack.gateway.http.route_context import get_state
from stack.gateway.openai_errors import Forbidden, InvalidRequest, ModelNotFound
from stack.gateway.routing.activity import to_csv
from stack.gateway.schemas import ChatCompletionRequest
from stack.gateway.tenants.gate import Caller
from stack.tracing.record import clock

log = logging.getLogger("stack.gateway.console")
router = APIRouter(prefix="/ui/api", include_in_schema=False)


@router.get("/models")
async def api_models(request: Request) -> dict[str, Any]:
    need_session(request)
    state = get_state(request)
    view = models_view(state)
    view["switching"] = state.manager.switching() if state.manager is not None else None
    view["served"] = list(state.model_cards())
    return view


@router.post("/models/{model:path}/{action}")
async def api_model_action(model: str, action: str, request: Request) -> dict[str, Any]:
    """Checked in full before anything runs (unknown model, a switch already running); the change itself runs
    in the background and shows on the `models` stream."""
    need_post(request, admin=True)
    state = get_state(request)
    if action not in ("load", "unload", "switch", "sleep"):
        raise InvalidRequest(f"unknown action {action!r}: load, unload, switch or sleep", param="action")
    manager, group = managed(state, model)
    running = manager.switching()
    if running is not None and action in ("load", "switch"):
        raise InvalidRequest(f"a switch to `{running}` is running: wait until it ends, then try again",
                             param="model", code="switch_running")  # fmt: skip
    action_: Action = action  # type: ignore[assignment]
    return await run_model_action(state, group, action_, wait=False)


@router.get("/activity")
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


@router.get("/trace/{request_id}")
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


@router.get("/usage")
async def api_usage(request: Request, format: str = "json", minutes: int = 60) -> Response:
    """The Usage page's data: every tenant for the admin role and viewer keys; a client key's own only."""
    session = need_session(request)
    state = get_state(request)
    tenant = state.dispatcher.tenants.book.by_name.get(session.key_name)
    only = tenant.name if tenant is not None and tenant.role == "client" else None
    return usage_answer(state, format, only, minutes)


@router.get("/keys")
async def api_keys(request: Request) -> dict[str, Any]:
    """The Keys page: every named key with its limits and what it used; the admin role only (as /admin/keys)."""
    session = need_session(request)
    if session.role != "admin":
        raise Forbidden("the named keys are shown to the admin role only: log in with the admin key",
                        code="admin_required")  # fmt: skip
    return list_named_keys(get_state(request))


@router.post("/keys", status_code=201)
async def api_add_key(spec: NewKey, request: Request) -> dict[str, Any]:
    """Add a named key as POST /admin/keys does; the key drawn is in this answer only (the page shows it once)."""
    session = need_post(request, admin=True)
    if spec.replace or spec.rotate or spec.sha256 is not None:  # the page adds new keys only; the CLI does the rest
        raise InvalidRequest("the console adds new keys only: change or rotate one with `vstack keys add NAME "
                             "--replace`", param="replace", code="console_add_only")  # fmt: skip
    answer = add_named_key(get_state(request), spec)
    log.info("console: named key %r (role %s) added by %r", spec.name, spec.role, session.key_name)
    return answer


@router.post("/keys/{name}/revoke")
async def api_revoke_key(name: str, request: Request) -> dict[str, Any]:
    session = need_post(request, admin=True)
    answer = revoke_named_key(get_state(request), name)
    end_sessions_of(request, name)
    log.info("console: named key %r revoked by %r", name, session.key_name)
    return answer


@router.get("/logs")
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


@router.get("/live")
async def api_live(request: Request) -> dict[str, Any]:
    need_session(request)
    return await console_of(request).sample()


@router.get("/plan")
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


@router.get("/reports/{index}/{name}")
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


@router.post("/chat")
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


@router.get("/events")
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
