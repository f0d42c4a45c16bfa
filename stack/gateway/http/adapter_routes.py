"""/admin/adapters: the LoRA adapters the gateway serves; add one while the engine runs (no restart).

An adapter added here is checked first (PEFT files present, rank within the engine's max_lora_rank,
trained on this base model) and refused with the reason; it is loaded into the engine on its first
request, like those of the config. Guarded like every /admin route.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stack.config.model_extras import AdapterEntry
from stack.errors import StackError
from stack.gateway.http.admin_routes import admin_key, require_text, unsaved
from stack.gateway.http.route_context import GatewayState, get_state
from stack.gateway.openai_errors import GatewayError, InvalidRequest, ModelNotFound
from stack.gateway.routing.adapters import Adapter

router = APIRouter(prefix="/admin", dependencies=[Depends(admin_key)])


class NewAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128)
    base: str = Field(min_length=1, description="the base model (a model group served with LoRA)")
    path: str | None = Field(None, description="a local folder with adapter_config.json and the weights")
    hub: str | None = Field(None, description="a Hugging Face Hub id")
    revision: str = "main"


def _book(state: GatewayState) -> Any:
    if state.adapters is None:
        raise InvalidRequest("this gateway serves no adapters")
    return state.adapters


def _public(state: GatewayState, adapter: Adapter) -> dict[str, Any]:
    loaded = [dep for dep in state.registry.all() if adapter.name in state.adapters.loaded(dep.id)]
    return {"name": adapter.name, "base": adapter.base, "path": adapter.path, "rank": adapter.rank,
            "source": adapter.source, "loaded_in": [d.id for d in loaded], "in_flight": adapter.in_flight}


@router.get("/adapters")
async def list_adapters(request: Request) -> dict[str, Any]:
    state = get_state(request)
    book = _book(state)
    bases = [{"model": b.group, "max_lora_rank": b.max_lora_rank, "max_loras": b.max_loras,
              "max_cpu_loras": b.max_cpu_loras, "runtime_updates": b.runtime_updates} for b in book.bases.values()]
    return {"bases": bases, "adapters": [_public(state, a) for a in book.adapters.values()]}


def shadowed(state: GatewayState, name: str) -> str | None:
    """Why `name` would take another name's traffic (a model, an alias, `default`, another adapter), or None."""
    if name in state.routing.aliases:
        return f"`{name}` is an alias (of `{state.routing.aliases[name]}`)"
    if name in state.routing.known_groups() or any(d.upstream_model == name for d in state.registry.all()):
        return f"`{name}` is a model's name"
    if state.adapters is not None and name in state.adapters.adapters:
        return f"`{name}` is served already; remove it first"
    return None


def _refuse_shadowing(state: GatewayState, name: str) -> None:
    why = shadowed(state, name)
    if why:  # an adapter named like a model or alias would take that name's traffic
        raise InvalidRequest(f"{why}; an adapter may not shadow it: pick another name", param="name",
                             code="name_taken")


@router.post("/adapters", status_code=201)
async def add_adapter(spec: NewAdapter, request: Request) -> dict[str, Any]:
    state = get_state(request)
    added = await register_adapter(state, spec)
    saved = spec.model_dump(exclude_none=True) | ({"path": added.path} if spec.path else {})  # absolute: cwd may change
    persisted = state.runtime.set_adapter(added.name, saved)
    return {**_public(state, added), **unsaved(state, persisted)}


async def register_adapter(state: GatewayState, spec: NewAdapter) -> Adapter:
    """Check and add an adapter (the admin call, and its replay at start: stack.gateway.http.runtime_state)."""
    from stack.gateway.routing.adapters import adapter_from_info

    require_text(spec.model_dump(mode="python"))
    book = _book(state)
    group = state.routing.resolve(spec.base) if spec.base not in book.bases else spec.base
    base = book.bases.get(group)
    if base is None:
        raise InvalidRequest(f"model `{spec.base}` runs without LoRA: add `adapters:` (or `lora:`) to its model "
                             "config and restart it", param="base")
    if not base.runtime_updates:
        raise InvalidRequest(f"model `{group}` has lora.runtime_updates: false", param="base")
    _refuse_shadowing(state, spec.name)
    # Reading files (or a Hub download) and every tensor blocks: in a thread, so /health and streams go on.
    info = await asyncio.to_thread(_checked, spec, base)
    _refuse_shadowing(state, spec.name)  # again: the name may have been taken while the files were read
    return book.add(adapter_from_info(info, group))


def _checked(spec: NewAdapter, base: Any) -> Any:
    """The adapter's files, rank, base model and weights (stack.vllm.lora.check_weights); in a worker thread."""
    from stack.vllm.lora import adapter_dir, check_fits, check_weights, inspect

    try:
        entry = AdapterEntry(name=spec.name, path=spec.path, hub=spec.hub, revision=spec.revision)
        info = inspect(entry, adapter_dir(entry))
        if info.rank > base.max_lora_rank:
            raise InvalidRequest(f"adapter `{spec.name}`: rank {info.rank} is above the engine's max_lora_rank "
                                 f"{base.max_lora_rank} (set lora.max_lora_rank in the model config and restart)",
                                 param="path", code="adapter_invalid")
        if base.model is not None:
            check_fits(info, base.model, None)
        check_weights(spec.name, info.path)  # last: it reads every tensor
    except StackError as exc:
        raise InvalidRequest(exc.message + (f" ({exc.hint})" if exc.hint else ""), param="path",
                             code="adapter_invalid") from None
    except ValidationError as exc:  # the entry's own checks (name, one source)
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or "name"
        raise InvalidRequest(f"adapter `{spec.name}`: {first.get('msg', 'invalid')}", param=param,
                             code="adapter_invalid") from None
    return info


@router.delete("/adapters/{name}")
async def remove_adapter(name: str, request: Request) -> dict[str, Any]:
    state = get_state(request)
    book = _book(state)
    adapter = book.adapters.get(name)
    kept = state.runtime.key_of(state.runtime.adapters, name)
    if adapter is None and kept is not None:  # in runtime.json but skipped at start: only the entry goes
        return {"removed": name, **unsaved(state, state.runtime.set_adapter(kept, None))}
    if adapter is None:
        raise ModelNotFound(f"no adapter `{name}`", param="name", code="adapter_not_found")
    if adapter.in_flight:
        raise Busy(f"adapter `{name}` is answering {adapter.in_flight} request(s); retry when they finish")
    await book.unload_everywhere(name, state.registry)
    book.adapters.pop(name)
    book.metrics.forget(name, adapter.base)
    persisted = state.runtime.set_adapter(name, None) if name in state.runtime.adapters else True
    return {"removed": name, **unsaved(state, persisted)}


class Busy(GatewayError):
    status, type, code = 409, "invalid_request_error", "adapter_busy"
