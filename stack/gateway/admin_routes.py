"""/admin/*: model and engine state, and deployments registered or removed while the gateway runs.

The CLI (`vstack status`) and the model manager use these. Guarded by the admin key, or by loopback
when no admin key is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Literal

from fastapi import APIRouter, Depends, Header, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from stack.config.litellm_providers import ProviderError, destination
from stack.config.sections.gateway import CloudDeployment
from stack.errors import StackError
from stack.gateway.auth import require_admin
from stack.gateway.errors import InvalidRequest, ModelNotFound
from stack.gateway.providers import KeyPolicy
from stack.gateway.registry import Deployment
from stack.gateway.state import GatewayState, get_state


def admin_key(
    request: Request,
    authorization: str | None = Header(None, include_in_schema=False),
    x_api_key: str | None = Header(None, include_in_schema=False),
) -> str:
    client = request.client.host if request.client else None
    return require_admin(get_state(request).admin_keys, authorization, x_api_key, client)


router = APIRouter(prefix="/admin", dependencies=[Depends(admin_key)])


class NewDeployment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_group: str = Field(min_length=1)
    kind: Literal["local", "cloud"] = "local"
    id: str | None = Field(None, min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._:-]+$")
    api_base: str | None = Field(None, description="local: http://HOST:PORT of an OpenAI-compatible server")
    upstream_model: str | None = Field(None, description="local: the engine's served model name")
    cloud: CloudDeployment | None = None
    order: int = Field(1, ge=1)
    context_window: int | None = Field(None, gt=0)
    timeout_s: float | None = Field(None, gt=0)

    @field_validator("api_base")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("api_base must be an http:// or https:// URL")
        return v.rstrip("/").removesuffix("/v1") if v else v


@router.get("/models")
async def models(request: Request) -> dict[str, Any]:
    return models_view(get_state(request))


def models_view(state: GatewayState) -> dict[str, Any]:
    """Every model group with its deployments and (when the gateway owns engines) the manager's view of it."""
    cooling = state.routing.cooling_down()
    out = []
    for group, deps in sorted(state.registry.groups().items()):
        ready = [d for d in deps if d.state == "ready" and d.id not in cooling]
        states = {d.state for d in deps}
        status = "ready" if ready else next((s for s in ("starting", "sleeping") if s in states), "unavailable")
        out.append(
            {
                "model": group,
                "state": status,
                "aliases": sorted(a for a in state.routing.aliases if state.routing.aliases[a] == group),
                "fallbacks": state.settings.fallbacks.get(group, []),
                "context_window_fallbacks": state.settings.context_window_fallbacks.get(group, []),
                "deployments": [{**d.public(), "cooling_down": d.id in cooling} for d in deps],
            }
        )
    manager = state.manager
    if manager is not None:
        status = manager.status()
        for entry in out:
            entry["manager"] = status["models"].get(entry["model"])
        return {"default": state.routing.default_group, "models": out,
                "manager": {k: v for k, v in status.items() if k != "models"}}  # fmt: skip
    return {"default": state.routing.default_group, "models": out}


Action = Literal["load", "unload", "switch", "sleep"]


@router.post("/models/{model:path}/{action}")
async def model_action(model: str, action: Action, request: Request, wait: bool = True) -> dict[str, Any]:
    """load: make it ready (co-resident if it fits, else evicting others); switch: load it and put every
    other model to sleep or stop it; unload: stop it; sleep: put it to sleep (GPU), else stop it.
    wait=false answers at once (202-like) and the change runs in the background."""
    return await run_model_action(get_state(request), model, action, wait)


async def run_model_action(state: GatewayState, model: str, action: Action, wait: bool = True) -> dict[str, Any]:
    """One admin action on a managed model (the admin API's and the console's): checked before anything runs."""
    manager = state.manager
    if manager is None:
        raise InvalidRequest("this gateway has no model manager (it serves fixed deployments)", param="model")
    group = state.routing.resolve(model)
    if not manager.manages(group):
        raise ModelNotFound(f"`{group}` is not a model this gateway starts", param="model")
    work = {
        "load": lambda: manager.load(group),
        "switch": lambda: manager.switch(group),
        "unload": lambda: manager.unload(group),
        "sleep": lambda: manager.unload(group, sleep=True),
    }[action]
    if not wait:
        task = asyncio.get_running_loop().create_task(work())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return {"model": group, "action": action, "accepted": True}
    with contextlib.suppress(StackError):  # a failed start is reported in the model's state below
        await work()
    return {"model": group, "action": action, **manager.status()["models"][group]}


@router.get("/engines")
async def engines(request: Request) -> dict[str, Any]:
    state = get_state(request)
    local = [d for d in state.registry.all() if d.kind == "local"]
    return {"engines": [{**d.public(), "metrics_path": f"/metrics/engines/{d.id}"} for d in local]}


@router.post("/deployments", status_code=201)
async def add_deployment(spec: NewDeployment, request: Request) -> dict[str, Any]:
    state = get_state(request)
    if spec.kind == "local":
        if not spec.api_base:
            raise InvalidRequest("a local deployment needs api_base", param="api_base")
        dep = Deployment(
            id=spec.id or state.registry.new_id("local"),
            model_group=spec.model_group,
            kind="local",
            upstream_model=spec.upstream_model or spec.model_group,
            api_base=spec.api_base,
            order=spec.order,
            context_window=spec.context_window,
            timeout_s=spec.timeout_s,
        )
    else:
        if spec.cloud is None:
            raise InvalidRequest("a cloud deployment needs `cloud` (litellm_params, api_key_env)", param="cloud")
        check_cloud(spec.cloud, state.key_policy)
        dep = cloud_deployment(spec.cloud, spec.id or state.registry.new_id("cloud"))
        dep.model_group = spec.model_group
    if state.registry.get(dep.id) is not None:
        raise InvalidRequest(f"deployment {dep.id!r} exists; DELETE it first", param="id")
    try:
        state.registry.add(dep)
    except Exception as exc:  # LiteLLM's Router refused it: take it out again, nothing stays half-registered
        with contextlib.suppress(Exception):
            state.registry.remove(dep.id)
        raise InvalidRequest(f"deployment {dep.id!r} could not be registered ({type(exc).__name__})",
                             param="cloud" if spec.kind == "cloud" else "api_base") from None
    return dep.public()


def check_cloud(c: CloudDeployment, policy: KeyPolicy | None) -> None:
    """400 before anything is registered: a provider LiteLLM does not know, or a key this gateway may not send."""
    try:
        destination(c.litellm_params)
    except ProviderError as exc:
        raise InvalidRequest(str(exc), param="cloud.litellm_params.model") from None
    problem = policy.problem(c.api_key_env, c.litellm_params) if policy is not None else None
    if problem:
        raise InvalidRequest(problem, param="cloud.api_key_env", code="provider_key_not_allowed")


@router.delete("/deployments/{dep_id}")
async def remove_deployment(dep_id: str, request: Request) -> dict[str, Any]:
    dep = get_state(request).registry.remove(dep_id)
    if dep is None:
        raise ModelNotFound(f"no deployment {dep_id!r}", param="id", code="deployment_not_found")
    return {"removed": dep.id}


def cloud_deployment(c: CloudDeployment, dep_id: str) -> Deployment:
    return Deployment(
        id=dep_id,
        model_group=c.model_name,
        kind="cloud",
        upstream_model=str(c.litellm_params["model"]),
        litellm_params=dict(c.litellm_params),
        api_key_env=c.api_key_env,
        order=c.order,
        context_window=c.context_window,
        timeout_s=c.timeout_s,
    )
