"""/v1/models and the client key every /v1 route requires (the POST routes: stack.gateway.http.endpoint_routes)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from stack.gateway.http.auth import require_caller
from stack.gateway.http.route_context import GatewayState, get_state
from stack.gateway.openai_errors import ModelNotFound


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
