"""The POST route of every endpoint in stack.gateway.endpoints, built from its entry (adr/0047).

One handler for all: it checks what the gateway reads of the body (the entry's `reads`: the model, the stream
flags; its errors rendered as FastAPI's validation errors are), then `checked_body` (the gateway's own limits,
shared with the fast path: one set of checks for both ways in), then the dispatcher. What is forwarded is the
client's JSON as sent: a local engine checks every other field itself (vLLM's own answer, for its own fields),
the cloud client checks it against the API's model. /openapi.json documents the API's model (`api`) as the body,
the parameters a client may send.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

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
        # a float too: vLLM takes 5000.0 as 5000 (pydantic's lax int)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > limit:
            return InvalidRequest(f"'{param}' is too large: {value:.15g} (this gateway allows at most {limit})",
                                  param=param)  # fmt: skip
    return None


def checked_body(state: GatewayState, endpoint: Endpoint, body: Any) -> dict[str, Any]:
    """The body once the gateway's own checks pass (its schema checked already); raises their refusal."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    if "model" not in body:  # /tokenize and /detokenize: vLLM's default, the served model
        body["model"] = endpoint.reads.model_fields["model"].default
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


async def _read(request: Request, reads: type[BaseModel]) -> Any:
    """The JSON body, checked against `reads` as FastAPI checks a declared body (the same errors, so the same
    messages): a body FastAPI would not parse as JSON (another content type, none) is not an object either."""
    raw = await request.body()
    body: Any = None
    if raw:
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        is_json = kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))
        try:
            body = await request.json() if is_json else raw
        except ValueError as exc:  # not JSON, or not UTF-8 (UnicodeDecodeError)
            pos, why = (exc.pos, exc.msg) if isinstance(exc, json.JSONDecodeError) else (0, "not UTF-8 text")
            raise RequestValidationError([{"type": "json_invalid", "loc": ("body", pos), "msg": "JSON decode error",
                                           "input": {}, "ctx": {"error": why}}]) from None  # fmt: skip
    try:
        reads.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
    return body


def _route(endpoint: Endpoint) -> Any:
    async def handle(request: Request) -> Response:
        checked_body(get_state(request), endpoint, await _read(request, endpoint.reads))
        return await _forward(request, endpoint.name)

    handle.__name__ = endpoint.path.strip("/").removeprefix("v1/").replace("/", "_")  # the operation's id
    return handle


def _documented(api: type[BaseModel]) -> dict[str, Any]:
    """The API model as the operation's request body, its definitions inlined (no route declares these models,
    so FastAPI's components do not hold them)."""
    schema = api.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            return inline(defs[ref.rsplit("/", 1)[-1]]) if ref else {k: inline(v) for k, v in node.items()}
        return [inline(v) for v in node] if isinstance(node, list) else node

    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline(schema)}}}}


router = APIRouter(dependencies=[Depends(client_key)])
for _endpoint in ENDPOINTS:
    for _i, _path in enumerate(_endpoint.paths):  # aliases work but are not documented twice
        router.add_api_route(_path, _route(_endpoint), methods=["POST"], include_in_schema=_i == 0,
                             openapi_extra=_documented(_endpoint.api))  # fmt: skip
