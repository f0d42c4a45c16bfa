"""/admin/*: model and engine state, and deployments registered or removed while the gateway runs.

The CLI (`vstack status`) and the model manager use these. Guarded by the admin key, or by loopback
when no admin key is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from typing import Any, Literal
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Header, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from stack.config.litellm_providers import ProviderError, destination
from stack.config.sections.gateway import CloudDeployment
from stack.errors import StackError
from stack.gateway.http.auth import bearer, is_loopback, local_client, require_admin
from stack.gateway.http.route_context import GatewayState, get_state
from stack.gateway.openai_errors import InvalidRequest, ModelNotFound
from stack.gateway.registry import Deployment
from stack.gateway.upstreams.provider_keys import KeyPolicy

log = logging.getLogger("stack.gateway.admin")


async def admin_key(
    request: Request,
    authorization: str | None = Header(None, include_in_schema=False),
    x_api_key: str | None = Header(None, include_in_schema=False),
) -> str:
    state = get_state(request)
    tenant = state.dispatcher.tenants.book.identify(bearer(authorization, x_api_key))
    if tenant is not None and tenant.role == "admin":  # a named key of the admin role (stack.gateway.tenants)
        request.state.key_name = tenant.name
        return tenant.name
    local = local_client(request.client.host if request.client else None, request.headers)
    name = require_admin(state.admin_keys, authorization, x_api_key, local, state.admin_token)
    request.state.key_name = name  # the request log names who changed what (the name, never the key)
    return name


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
                "deployments": [listed(d, cooling, state) for d in deps],
            }
        )
        if any("replica" in d.labels for d in deps):  # how its replicas are chosen (gateway.replica_routing)
            out[-1]["replica_routing"] = str(state.routing.replicas.routing_of(group))
            if made := state.routing.replicas.choices.get(group):  # kv_events: by the cache, the balance rule, ...
                out[-1]["replica_choices"] = dict(made)
    manager = state.manager
    gateway = {"log": state.log_problem(), "unresponsive": state.dispatcher.liveness.unresponsive(),
               "runtime_state": state.runtime.report()}
    if manager is not None:
        status = manager.status()
        for entry in out:
            entry["manager"] = status["models"].get(entry["model"])
        return {"default": state.routing.default_group, "models": out, "gateway": gateway,
                "manager": {k: v for k, v in status.items() if k != "models"}}  # fmt: skip
    return {"default": state.routing.default_group, "models": out, "gateway": gateway}


def listed(dep: Deployment, cooling: Any, state: GatewayState | None = None) -> dict[str, Any]:
    """A deployment as /admin shows it; one that cannot be shown (a bug, a bad entry) is an error entry that
    says why and how to remove it, never a 500 for the whole list. A replica whose engine publishes its KV events
    shows what the gateway's index holds of it (`kv_events`)."""
    try:
        shown = {**dep.public(), "cooling_down": dep.id in cooling}
        kv = state.routing.replicas.kv.describe(dep.id) if state is not None else None
        if kv is not None:
            shown["kv_events"] = kv
        bad = not_text(shown)
        if bad is None:
            return shown
        why = f"{bad} is not valid text"
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}".encode("utf-8", "replace").decode()
    dep_id = str(dep.id).encode("utf-8", "backslashreplace").decode()
    log.error("deployment %s cannot be listed (%s): remove it with `vstack deployments rm %s`", dep_id, why, dep_id)
    return {"id": dep_id, "state": "error", "error": f"cannot be listed: {why}; remove it with DELETE "
            f"/admin/deployments/{dep_id} (`vstack deployments rm {dep_id}`)"}


Action = Literal["load", "unload", "switch", "sleep"]


@router.post("/models/{model:path}/{action}")
async def model_action(model: str, action: Action, request: Request, wait: bool = True) -> dict[str, Any]:
    """load: make it ready (co-resident if it fits, else evicting others); switch: load it and put every
    other model to sleep or stop it; unload: stop it; sleep: put it to sleep (GPU), else stop it.
    wait=false answers at once (202-like) and the change runs in the background."""
    return await run_model_action(get_state(request), model, action, wait)


def managed(state: GatewayState, model: str) -> tuple[Any, str]:
    """(the manager, the model group `model` names), or the client's error: no manager, or not a model it starts."""
    manager = state.manager
    if manager is None:
        raise InvalidRequest("this gateway has no model manager (it serves fixed deployments)", param="model")
    group = state.routing.resolve(model)
    if not manager.manages(group):
        raise ModelNotFound(f"`{model}` is not a model this gateway starts", param="model")
    return manager, group


async def run_model_action(state: GatewayState, model: str, action: Action, wait: bool = True) -> dict[str, Any]:
    """One admin action on a managed model (the admin API's and the console's): checked before anything runs."""
    manager, group = managed(state, model)
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


class ReloadBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    engine_python: str | None = Field(None, description="serve from this Python from now on (`vstack upgrade "
                                      "apply`: a candidate venv the upgrade check built)")


@router.post("/reload")
async def reload(request: Request, body: ReloadBody | None = None) -> dict[str, Any]:
    """Read the configuration again: engines whose rendered command changed restart (in the background,
    each after draining), the others keep serving. What it kept, restarts and could not apply."""
    state = get_state(request)
    if state.reload is None:
        raise InvalidRequest("this gateway cannot reload: it does not own its engines (start it with `vstack up`)",
                             param=None)
    if body is not None and body.engine_python:
        return await state.reload(engine_python=body.engine_python)  # type: ignore[call-arg]
    return await state.reload()


@router.get("/engines")
async def engines(request: Request) -> dict[str, Any]:
    state = get_state(request)
    local = [d for d in state.registry.all() if d.kind == "local"]
    return {"engines": [{**shown, "metrics_path": f"/metrics/engines/{d.id}"} if "error" not in shown else shown
                        for d in local for shown in [listed(d, ())]]}


@router.post("/deployments", status_code=201)
async def add_deployment(spec: NewDeployment, request: Request) -> dict[str, Any]:
    state = get_state(request)
    dep = register_deployment(state, spec)
    saved = {**spec.model_dump(exclude_none=True, mode="json"), "id": dep.id}  # the same id after a restart
    persisted = state.runtime.set_deployment(dep.id, saved)
    return {**dep.public(), **unsaved(state, persisted)}


def unsaved(state: Any, persisted: bool) -> dict[str, str]:
    """Said in the answer of a change that could not be written to state_dir (it is live until a restart)."""
    return {} if persisted else {"warning": f"applied, but not persisted: {state.runtime.write_error}"}


def not_text(value: Any, where: str = "") -> str | None:
    """The first place in `value` (a body, a file's entry) holding a string that is not text: JSON lets a lone
    UTF-16 surrogate (\\ud800, or its raw bytes ED A0 80, which Python's json decodes) through, and any later
    answer that shows it fails to encode. None when every string is text."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where or "the value"
        return None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        here = f"{where}.{key}" if where else str(key)
        found = not_text(key, here + " (the key)") if isinstance(key, str) else None
        found = found or not_text(item, here)
        if found:
            return found
    return None


def require_text(body: dict[str, Any]) -> None:
    bad = not_text(body)
    if bad is not None:
        raise InvalidRequest(f"{bad} is not valid text (a lone UTF-16 surrogate): send UTF-8 text; nothing was "
                             "added", param=bad, code="invalid_text")


def register_deployment(state: Any, spec: NewDeployment) -> Deployment:
    """Check and register a deployment (the admin call, and its replay at start: stack.gateway.http.runtime_state)."""
    require_text(spec.model_dump(mode="python"))
    check_name(state, spec)
    if spec.kind == "local":
        if not spec.api_base:
            raise InvalidRequest("a local deployment needs api_base", param="api_base")
        check_internal(state, spec.api_base)
        dep = Deployment(
            id=spec.id or state.registry.new_id("local"),
            model_group=spec.model_group,
            kind="local",
            upstream_model=spec.upstream_model or spec.model_group,
            api_base=spec.api_base,
            order=spec.order,
            context_window=spec.context_window,
            timeout_s=spec.timeout_s,
            labels={"added": "admin"},
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
    except Exception as exc:  # a listener refused it: take it out again, nothing stays half-registered
        with contextlib.suppress(Exception):
            state.registry.remove(dep.id)
        raise InvalidRequest(f"deployment {dep.id!r} could not be registered ({type(exc).__name__})",
                             param="cloud" if spec.kind == "cloud" else "api_base") from None
    return dep


def check_name(state: GatewayState, spec: NewDeployment) -> None:
    """A runtime deployment may not take another name's traffic: an alias (`default` included) or an adapter
    stays what it is, and a cloud deployment joins a locally served model only behind its engines (a higher
    `order`), so it cannot draw that model's traffic to a provider."""
    name = spec.model_group
    if name in state.routing.aliases:
        raise InvalidRequest(f"`{name}` is an alias (of `{state.routing.aliases[name]}`); a deployment may not "
                             "shadow it: name the model group itself", param="model_group", code="name_taken")
    if state.adapters is not None and name in state.adapters.adapters:
        raise InvalidRequest(f"`{name}` is a LoRA adapter's name; a deployment may not shadow it",
                             param="model_group", code="name_taken")
    local = [d.order for d in state.registry.all() if d.model_group == name and d.kind == "local"]
    if spec.kind == "cloud" and local and spec.order <= max(local):
        raise InvalidRequest(f"`{name}` is served by a local engine (order {max(local)}); a cloud deployment may "
                             f"only follow it: set order above {max(local)}", param="order", code="name_taken")


def check_internal(state: GatewayState, api_base: str) -> None:
    """A local deployment is one the gateway fetches from (requests, /metrics/engines): loopback, a configured
    internal network or host, or a host of an engine the gateway was set up with; never any other host."""
    host = (urlsplit(api_base).hostname or "").lower()
    known = {(urlsplit(d.api_base).hostname or "").lower() for d in state.registry.all()
             if d.kind == "local" and d.api_base and d.labels.get("added") != "admin"}  # fmt: skip
    if is_loopback(host) or host in known or internal_host(host, state.settings.internal_networks):
        return
    raise InvalidRequest(f"api_base host {host!r} is not loopback or an internal network of this gateway; it "
                         "would fetch from there", param="api_base", code="destination_not_allowed")


def internal_host(host: str, networks: list[str]) -> bool:
    """`host` is an address inside one of the CIDRs, or one of the host names, of gateway.internal_networks
    (names are compared, never resolved: DNS cannot move a name inside)."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host in {n.lower() for n in networks if "/" not in n}
    return any(address in ipaddress.ip_network(n, strict=False) for n in networks if "/" in n)


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
    state = get_state(request)
    dep = state.registry.get(dep_id)
    kept = state.runtime.key_of(state.runtime.deployments, dep_id)
    if dep is None and kept is not None:  # kept in runtime.json but skipped at start (its reason in /admin/models)
        persisted = state.runtime.set_deployment(kept, None)
        return {"removed": dep_id, **unsaved(state, persisted)}
    if dep is None:
        raise ModelNotFound(f"no deployment {dep_id!r}", param="id", code="deployment_not_found")
    if dep.labels.get("managed") == "1":
        # Its engine is the model manager's: removing the route would leave the engine running, unreachable,
        # and the model impossible to load again. Unloading stops the engine and keeps the model loadable.
        raise Conflict(f"deployment {dep_id!r} is the engine the gateway runs for `{dep.model_group}`; it cannot "
                       f"be removed. Stop it with POST /admin/models/{dep.model_group}/unload (`vstack unload "
                       f"{dep.model_group}`); load it again with .../load", param="id",
                       code="deployment_managed")
    state.registry.remove(dep_id)
    persisted = state.runtime.set_deployment(dep_id, None) if dep_id in state.runtime.deployments else True
    return {"removed": dep.id, **unsaved(state, persisted)}


class Conflict(InvalidRequest):
    status = 409


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
