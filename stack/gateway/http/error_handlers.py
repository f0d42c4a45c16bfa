"""The one place a GatewayError (or a validation or routing error of FastAPI's) becomes a response: OpenAI's
error envelope with its status. Messages never echo the input; 4xx the gateway answers itself are counted."""

from __future__ import annotations

import logging
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from stack.gateway.endpoints import ENDPOINTS
from stack.gateway.metrics import GatewayMetrics
from stack.gateway.openai_errors import GatewayError, UpstreamError, envelope, validation_message

log = logging.getLogger("stack.gateway")


def error_response(exc: GatewayError) -> Response:
    if isinstance(exc, UpstreamError) and exc.upstream_body and exc.status < 500:
        # An engine's own 4xx is already OpenAI-shaped (vLLM renders the same envelope): pass it through.
        return Response(exc.upstream_body, exc.status, headers=exc.headers, media_type="application/json")
    return JSONResponse(exc.body(), exc.status, headers=exc.headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    return validation_message(exc.errors())


def count_rejection(metrics: GatewayMetrics | None, status: int, reason: str) -> None:
    """4xx the gateway itself answered, by status and reason, for /metrics (engines' own 4xx are counted
    with the requests they answered)."""
    if metrics is not None and 400 <= status < 500:
        metrics.rejected.labels(str(status), reason).inc()


# The OpenAI routes whose refusals the console's Activity lists (stack.gateway.routing.activity), by endpoint.
ACTIVITY_ROUTES = {p: e.name for e in ENDPOINTS if e.path.startswith("/v1/") for p in e.paths}


def _count_rejection(request: Request, status: int, reason: str, listed: bool = False) -> None:
    """Counted for /metrics; listed in Activity too unless it is there already (`listed`)."""
    gateway = getattr(request.app.state, "gateway", None)
    count_rejection(getattr(gateway, "metrics", None), status, reason)
    endpoint = ACTIVITY_ROUTES.get(request.url.path)
    if gateway is not None and endpoint is not None and request.method == "POST" and not listed:
        # Refused before the dispatcher saw it (a missing or wrong key, a body that does not parse): a user
        # looking for their request in Activity finds it there with its status and reason.
        gateway.dispatcher.activity.add(endpoint=endpoint, model="-", deployment="-", route="refused",
                                        status=str(status), started=time.perf_counter(), why=reason)  # fmt: skip


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GatewayError)
    async def _gateway(request: Request, exc: GatewayError) -> Response:
        if not isinstance(exc, UpstreamError):
            _count_rejection(request, exc.status, exc.rejection or exc.code or exc.type, listed=exc.in_activity)
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        _count_rejection(request, 400, "invalid_body")
        return JSONResponse(envelope(message, "invalid_request_error", param, None), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        _count_rejection(
            request, exc.status_code, {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http")
        )
        kinds = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error"}
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        return JSONResponse(
            envelope(message, kinds.get(exc.status_code, "invalid_request_error"), None, None),
            exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        # A bug of ours. Logged with its traceback; the client gets no internals.
        log.exception("unhandled error in the gateway")
        return JSONResponse(envelope("internal error in the gateway", "server_error", None, None), 500)
