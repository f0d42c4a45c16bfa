"""Any path under /v1 no route serves: OpenAI's 404 JSON naming it (or 405 for a wrong method), never a
framework default. Its text lists the endpoints the gateway serves (stack.gateway.endpoints)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.routing import Match

from stack.gateway.endpoints import ENDPOINTS
from stack.gateway.openai_errors import GatewayError


class UnknownEndpoint(GatewayError):
    status, type, code = 404, "invalid_request_error", "unknown_endpoint"


class WrongMethod(GatewayError):
    status, type, code = 405, "invalid_request_error", "method_not_allowed"


unknown = APIRouter()
_V1 = [e.path for e in ENDPOINTS if e.path.startswith("/v1/") and e.path.count("/") == 2]
SERVED = ", ".join(_V1) + " and /v1/models"


@unknown.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
async def unknown_endpoint(path: str, request: Request) -> Response:
    """Last route: a path no other route serves (or serves with another method)."""
    for route in request.app.router.routes:
        if route is not request.scope.get("route") and route.matches(request.scope)[0] == Match.PARTIAL:
            raise WrongMethod(f"Method {request.method} is not allowed on /v1/{path}.")
    raise UnknownEndpoint(f"Unknown endpoint: {request.method} /v1/{path}. This gateway serves {SERVED}.")
