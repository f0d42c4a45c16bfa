"""/v1/*: thin handlers. Validation is the schema's, routing is the dispatcher's."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel
from starlette.responses import Response

from stack.gateway.http.auth import require_caller
from stack.gateway.http.relay_response import respond
from stack.gateway.http.route_context import GatewayState, get_state
from stack.gateway.openai_errors import InvalidRequest, ModelNotFound
from stack.gateway.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from stack.tracing.record import clock


async def client_key(request: Request) -> str | None:
    # async: a plain def runs in the thread pool, a hop per request. The two headers are read here, not declared
    # as FastAPI Header() parameters: resolving those took about half of the route's CPU per request (adr/0031).
    headers, state = request.headers, get_state(request)
    caller = require_caller(state.keys, state.dispatcher.tenants.book, headers.get("authorization"),
                            headers.get("x-api-key"))  # fmt: skip
    request.state.key_name = caller.key_name  # the key's name (never the key) for gateway.log_requests
    request.state.caller = caller  # its named key's limits and class (stack.gateway.tenants)
    return caller.key_name


router = APIRouter(prefix="/v1", dependencies=[Depends(client_key)])


def too_many_tokens(state: GatewayState, req: BaseModel) -> InvalidRequest | None:
    """The refusal of a request that asks for more tokens than this gateway allows; None when within."""
    limit = state.settings.max_tokens_limit
    for param in ("max_tokens", "max_completion_tokens"):
        value = getattr(req, param, None)
        if value is not None and value > limit:
            return InvalidRequest(f"'{param}' is too large: {value} (this gateway allows at most {limit})", param=param)
    return None


def _check_limits(state: GatewayState, req: BaseModel) -> None:
    refusal = too_many_tokens(state, req)
    if refusal is not None:
        raise refusal


async def _forward(request: Request, endpoint: str) -> Response:
    # FastAPI parsed the JSON once (and cached it); forward that dict, not the validated model, so
    # fields pass through exactly as the client sent them.
    body = await request.json()
    dispatcher = get_state(request).dispatcher
    trace = None
    if dispatcher.tracer is not None:  # a request the fast path did not take (a browser's, a chunked body...)
        trace = dispatcher.trace(endpoint, clock(), request.headers.get("traceparent"))
    return respond(await dispatcher.handle(endpoint, body, trace, getattr(request.state, "caller", None)))


@router.post("/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
    _check_limits(get_state(request), req)
    return await _forward(request, "chat")


@router.post("/completions")
async def completions(req: CompletionRequest, request: Request) -> Response:
    _check_limits(get_state(request), req)
    return await _forward(request, "completions")


@router.post("/embeddings")
async def embeddings(req: EmbeddingRequest, request: Request) -> Response:
    return await _forward(request, "embeddings")


def _model_card(name: str, owner: str, created: int, state: GatewayState | None = None) -> dict:
    card = {"id": name, "object": "model", "created": created, "owned_by": owner}
    adapter = state.adapters.lookup(name) if state is not None and state.adapters is not None else None
    if adapter is not None:  # a LoRA adapter: served by its base model's engine
        card["parent"] = adapter.base
    return card


@router.get("/models")
async def list_models(request: Request) -> dict:
    state = get_state(request)
    cards = state.model_cards()
    return {"object": "list", "data": [_model_card(n, o, state.started, state) for n, o in cards.items()]}


@router.get("/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict:
    state = get_state(request)
    cards = state.model_cards()
    if model_id not in cards:
        raise ModelNotFound(f"The model `{model_id}` does not exist.", param="model")
    return _model_card(model_id, cards[model_id], state.started, state)
