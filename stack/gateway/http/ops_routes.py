"""Liveness and readiness (open: load balancers and health checks need no key, and they say only "up" and
which model is the default), and metrics behind the keys (adr/0020): the metrics key (Prometheus' bearer
token), a client key or the admin key; open only when no key of any kind is configured."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from stack.gateway.http.auth import KeyRing, bearer, require_client_key
from stack.gateway.http.route_context import get_state
from stack.gateway.openai_errors import ModelNotFound, UpstreamError


def metrics_key(
    request: Request,
    authorization: str | None = Header(None, include_in_schema=False),
    x_api_key: str | None = Header(None, include_in_schema=False),
) -> str | None:
    state = get_state(request)
    book = state.dispatcher.tenants.book
    tenant = book.identify(bearer(authorization, x_api_key))
    if tenant is not None:  # any named key reads the metrics (a viewer key is made for that)
        return tenant.name
    ring = state.metrics_keys if state.metrics_keys is not None else KeyRing({})
    if book.enabled and not ring.enabled:  # named keys but no other: /metrics is not open either
        ring = KeyRing({"-": b"\0" * 32})
    return require_client_key(ring, authorization, x_api_key)


router = APIRouter()
SCRAPABLE = ("ready", "sleeping")  # deployment states whose engine answers /metrics (a sleeping one does)


@router.get("/health")
async def health(request: Request) -> dict[str, object]:
    """The gateway process is alive (200 while it can answer at all: restarting it would not revive an engine,
    and it serves the fallbacks). Engines found unresponsive (stack.gateway.routing.liveness)
    and log lines it cannot write (a full disk: stack.gateway.log_health) make it `degraded`."""
    state = get_state(request)
    hung, log = state.dispatcher.liveness.unresponsive(), state.log_problem()
    problems = {**({"unresponsive": hung} if hung else {}), **({"log": log} if log else {})}
    return {"status": "degraded", **problems} if problems else {"status": "ok"}


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    state = get_state(request)
    group = state.routing.default_group
    if state.default_ready():
        return JSONResponse({"status": "ready", "model": group})
    retry = str(state.settings.retry_after_s)
    hung = {d.id: d.detail for d in state.registry.groups().get(group, []) if d.state == "unresponsive"}
    body = {"status": "not ready", "model": group, **({"unresponsive": hung} if hung else {})}
    return JSONResponse(body, 503, headers={"Retry-After": retry})


@router.get("/metrics", dependencies=[Depends(metrics_key)])
async def metrics(request: Request) -> Response:
    state = get_state(request)
    state.metrics.deployment_up.clear()  # removed deployments' series go: the label set is what exists now
    for dep in state.registry.all():
        state.metrics.deployment_up.labels(dep.model_group, dep.id, dep.kind).set(dep.state == "ready")
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/metrics/engines/{dep_id}", dependencies=[Depends(metrics_key)])
async def engine_metrics(dep_id: str, request: Request) -> Response:
    """An engine's own vllm:* metrics, unchanged: engines listen on loopback, Prometheus scrapes here."""
    state = get_state(request)
    dep = state.registry.get(dep_id)
    if dep is None or dep.kind != "local" or not dep.api_base:
        raise ModelNotFound(f"no local engine {dep_id!r}", code="engine_not_found")
    session = state.dispatcher.local.session
    try:
        async with session.get(f"{dep.api_base}/metrics", headers=dep.auth()) as resp:
            body = await resp.read()
            return Response(body, resp.status, media_type=resp.content_type or "text/plain")
    except Exception as exc:
        raise UpstreamError(f"{dep_id} metrics unavailable", status=502, retryable=False) from exc


def scrape_address(request: Request, port: int) -> str:
    """Where Prometheus reaches this gateway: the address the request came in on (the server's own socket
    address, as a client cannot forge it), never the Host header a client writes."""
    server = request.scope.get("server")
    if server and server[0]:
        host, bound = server
        return f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
    return f"127.0.0.1:{port}"


@router.get("/metrics/targets", dependencies=[Depends(metrics_key)])
async def targets(request: Request) -> list[dict]:
    """Prometheus HTTP service discovery: one target per running engine, scraped through this gateway.
    A stopped or starting engine answers no /metrics: listed, it would only show as a down target (its state
    is in vstack_gateway_deployment_up)."""
    state = get_state(request)
    host = scrape_address(request, state.settings.port)
    return [
        {
            "targets": [host],
            "labels": {
                "__metrics_path__": f"/metrics/engines/{d.id}",
                "deployment": d.id,
                "model_group": d.model_group,
            },
        }
        for d in state.registry.all()
        if d.kind == "local" and d.state in SCRAPABLE and d.routable  # a replica set's summary: its replicas are listed
    ]
