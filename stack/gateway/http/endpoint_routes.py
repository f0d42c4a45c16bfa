"""The POST route of every endpoint in stack.gateway.endpoints, built from its entry (adr/0047).

One handler for all: the body's schema is FastAPI's to check (the entry's request model, which also gives
/openapi.json its schema), then `checked_body` (the gateway's own limits, shared with the fast path: one set of
checks for both ways in), then the dispatcher. What is forwarded is the client's JSON as sent.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel
from starlette.responses import Response

from stack.gateway import request_fields
from stack.gateway.endpoints import ENDPOINTS, Endpoint
from stack.gateway.http.openai_routes import client_key
from stack.gateway.http.relay_response import respond
from stack.gateway.http.route_context import GatewayState, get_state
from stack.gateway.openai_errors import InvalidRequest
from stack.tracing.record import clock


def too_many_tokens(state: GatewayState, endpoint: Endpoint, body: dict[str, Any]) -> InvalidRequest | None:
    """The refusal of a request that asks for more tokens than this gateway allows; None when within."""
    limit = state.settings.max_tokens_limit
    for param in endpoint.token_fields:
        value = body.get(param)
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            return InvalidRequest(f"'{param}' is too large: {value} (this gateway allows at most {limit})", param=param)
    return None


def checked_body(state: GatewayState, endpoint: Endpoint, body: Any) -> dict[str, Any]:
    """The body once the gateway's own checks pass (its schema checked already); raises their refusal."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    if "model" not in body:  # /tokenize and /detokenize: vLLM's default, the served model
        body["model"] = endpoint.request.model_fields["model"].default
    extra = request_fields.unknown(endpoint.name, body)
    if extra:  # never forwarded: LiteLLM would take e.g. `api_base` as where to send our provider key
        raise InvalidRequest(
            f"Unrecognized request argument supplied: {', '.join(extra)}. "
            f"{endpoint.path} takes the fields its API defines; remove it.",
            param=extra[0],
        )
    refusal = too_many_tokens(state, endpoint, body)
    if refusal is not None:
        raise refusal
    return body


async def _forward(request: Request, name: str) -> Response:
    # FastAPI parsed the JSON once (and cached it: the dict checked_body saw); forward that dict, not the
    # validated model, so fields pass through exactly as the client sent them.
    dispatcher = get_state(request).dispatcher
    trace = None
    if dispatcher.tracer is not None:  # a request the fast path did not take (a browser's, a chunked body...)
        trace = dispatcher.trace(name, clock(), request.headers.get("traceparent"))
    body = await request.json()
    return respond(await dispatcher.handle(name, body, trace, getattr(request.state, "caller", None)))


def _route(endpoint: Endpoint) -> Any:
    async def handle(req: BaseModel, request: Request) -> Response:
        checked_body(get_state(request), endpoint, await request.json())
        return await _forward(request, endpoint.name)

    handle.__annotations__ = {"req": endpoint.request, "request": Request, "return": Response}
    handle.__name__ = endpoint.path.strip("/").removeprefix("v1/").replace("/", "_")  # the operation's id
    return handle


router = APIRouter(dependencies=[Depends(client_key)])
for _endpoint in ENDPOINTS:
    for _i, _path in enumerate(_endpoint.paths):  # aliases work but are not documented twice
        router.add_api_route(_path, _route(_endpoint), methods=["POST"], include_in_schema=_i == 0)
