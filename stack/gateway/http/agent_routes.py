"""The APIs agents and coding tools speak, beside chat completions: OpenAI Responses (/v1/responses),
Anthropic Messages (/v1/messages, `x-api-key` accepted like a bearer key), and vLLM's /tokenize and
/detokenize. Local engines serve them (vLLM mounts all four); cloud deployments go through LiteLLM's
responses and anthropic-messages paths. The body is checked lightly (a JSON object naming a model, only the
fields its API defines: `request_fields`) and forwarded as sent; the engine validates the rest and its errors
come back in OpenAI's shape.

Any other path answers OpenAI's 404 JSON naming it, never a framework default.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response
from starlette.routing import Match

from stack.gateway import request_fields
from stack.gateway.http.openai_routes import client_key
from stack.gateway.http.relay_response import respond
from stack.gateway.http.route_context import get_state
from stack.gateway.openai_errors import GatewayError, InvalidRequest
from stack.tracing.record import clock


class _Named(BaseModel):
    # Forwarded as sent: the engine (or LiteLLM) checks the fields of these rich APIs.
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)


class ResponsesRequest(_Named):
    input: str | list[dict[str, Any]] | None = None
    stream: bool | None = None
    metadata: dict[str, str] | None = None  # string pairs, as OpenAI defines it


class MessagesRequest(_Named):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    stream: bool | None = None
    metadata: dict[str, str] | None = None  # Anthropic's {"user_id": ...}


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = "default"


router = APIRouter(dependencies=[Depends(client_key)])


async def _forward(request: Request, endpoint: str) -> Response:
    body = await request.json()
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    body.setdefault("model", "default")
    extra = request_fields.unknown(endpoint, body)
    if extra:  # never forwarded: LiteLLM would take e.g. `api_base` as where to send our provider key
        raise InvalidRequest(f"Unrecognized request argument supplied: {', '.join(extra)}. "
                             f"{request.url.path} takes the fields its API defines; remove it.", param=extra[0])
    state = get_state(request)
    if endpoint in ("chat", "messages", "responses"):
        limit, asked = state.settings.max_tokens_limit, body.get("max_tokens", body.get("max_output_tokens"))
        if isinstance(asked, int) and asked > limit:
            raise InvalidRequest(f"'max_tokens' is too large: {asked} (this gateway allows at most {limit})",
                                 param="max_tokens")  # fmt: skip
    dispatcher = state.dispatcher
    trace = None
    if dispatcher.tracer is not None:
        trace = dispatcher.trace(endpoint, clock(), request.headers.get("traceparent"))
    return respond(await dispatcher.handle(endpoint, body, trace, getattr(request.state, "caller", None)))


@router.post("/v1/responses")
async def responses(req: ResponsesRequest, request: Request) -> Response:
    return await _forward(request, "responses")


@router.post("/v1/messages")
async def messages(req: MessagesRequest, request: Request) -> Response:
    return await _forward(request, "messages")


@router.post("/v1/messages/count_tokens")
async def count_tokens(req: _Named, request: Request) -> Response:
    return await _forward(request, "count_tokens")


@router.post("/tokenize")
async def tokenize(req: TokenizeRequest, request: Request) -> Response:
    return await _forward(request, "tokenize")


@router.post("/detokenize")
async def detokenize(req: TokenizeRequest, request: Request) -> Response:
    return await _forward(request, "detokenize")


class UnknownEndpoint(GatewayError):
    status, type, code = 404, "invalid_request_error", "unknown_endpoint"


class WrongMethod(GatewayError):
    status, type, code = 405, "invalid_request_error", "method_not_allowed"


unknown = APIRouter()


@unknown.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
async def unknown_endpoint(path: str, request: Request) -> Response:
    """Last route: a path no other route serves (or serves with another method)."""
    for route in request.app.router.routes:
        if route is not request.scope.get("route") and route.matches(request.scope)[0] == Match.PARTIAL:
            raise WrongMethod(f"Method {request.method} is not allowed on /v1/{path}.")
    raise UnknownEndpoint(f"Unknown endpoint: {request.method} /v1/{path}. This gateway serves "
                          "/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/messages "
                          "and /v1/models.")
