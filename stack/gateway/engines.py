"""The gateway owns its engines through the model manager (stack.manager): register, start, watch, stop.

Each engine is a deployment in the registry, kept in the manager's state (stopped, starting, ready,
sleeping, stopping, failed) by a subscription to the manager's state changes: requests for a model that
is not ready wait for it (or get 503 + Retry-After), not 404. Only `ready` deployments are routed to.
Blocking process work runs in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from stack.engine.runtime import Runtime, engine_key
from stack.gateway.http.route_context import GatewayState
from stack.gateway.registry import Deployment, DeploymentRegistry
from stack.gateway.routing.adapters import Adapter, Base
from stack.manager.manager import ModelManager
from stack.manager.slot import Slot
from stack.manager.states import ModelState
from stack.manager.supervise import watch

log = logging.getLogger("stack.gateway.engines")


@dataclass
class ManagedEngine:
    engine: Runtime
    model_group: str  # the name clients ask for (the model's api_name)
    served_name: str  # what the engine calls it (--served-model-name)
    deployment_id: str = ""
    factory: Callable[[], Runtime] | None = field(default=None, repr=False)  # fresh engine per cold start
    need: int | None = None  # bytes while awake (stack.manager.memory.engine_need)
    need_source: str = ""
    can_sleep: bool = False
    weights_gpu: int | None = None  # weight bytes per GPU and of all ranks (stack.manager.memory.engine_weights)
    weights_host: int | None = None
    preload: bool = True
    task: str = "generate"  # what the model does (stack.gateway.routing.model_tasks): generate or embed
    lora: Base | None = None  # the engine runs with LoRA: its limits
    adapters: list[Adapter] = field(default_factory=list)  # served on this engine, loaded on first request
    keeps_host_copy: bool = False  # a later sleep only releases memory (stack.engine.sleep_copy)
    prefix_cache_bytes: int = 0  # its prefix cache's CPU tier across sleep (stack.vllm.kv_offload)
    slo: list[str] = field(default_factory=list)  # its objectives (models.*.slo or its profile's): the spill's
    scheduling: str = ""  # its engine's scheduling_policy: `priority` takes each request's class (adr/0043)
    replica_routing: str = ""  # its own gateway.replica_routing_models entry ("": the gateway-wide one)
    model_path: str = ""  # its folder, when its replicas publish KV events: the gateway's tokenizer for them
    gpus: frozenset[int] | None = None  # the GPUs its environment pins it to (stack.manager.memory.pinned_gpus)


class EngineSupervisor:
    """The gateway's side of the model manager, which the composition root builds and hands in
    (stack.assemble.runtimes.engine_supervisor); the gateway's dispatcher is given it as its admission when the
    app is built: `create_app(..., manager=sup.manager)`. `start`/`stop` are the app's hooks."""

    def __init__(self, engines: list[ManagedEngine], manager: ModelManager) -> None:
        self.engines = engines
        for m in engines:
            m.deployment_id = m.deployment_id or f"engine-{m.model_group}"
        self.manager = manager
        self._watch: asyncio.Task | None = None
        self.keep_engines: Callable[[], bool] = lambda: False  # asked at shutdown: leave the engines running
        self.keep_asleep: Callable[[], bool] = lambda: False  # ... or keep those with sleep mode asleep (adr/0030)
        self.report_down: Callable[[list[str]], None] = lambda notes: None  # what was kept and stopped, for `down`

    async def start(self, state: GatewayState) -> ModelManager:
        """on_startup hook: register every engine, follow the manager's states, start the preloaded ones in
        the background, watch."""
        ids = {m.model_group: m.deployment_id for m in self.engines}
        for m in self.engines:
            spec = m.engine.spec
            role = {"role": "set"} if has_replicas(m.engine) else {}
            if m.scheduling == "priority":
                role["scheduling"] = "priority"
            state.registry.add(Deployment(
                id=m.deployment_id, model_group=m.model_group, kind="local", upstream_model=m.served_name,
                api_base=spec.base_url, engine_key=engine_key(m.engine), state="stopped",
                labels={"engine": spec.name, "managed": "1", "runtime": m.engine.runtime_kind, "task": m.task, **role},
            ))  # fmt: skip
            state.routing.replicas.configure(m.model_group, m.replica_routing or None, m.model_path or None)
            if m.slo:  # its TTFT objective: requests spill to its fallbacks before it breaks (gateway.spill)
                state.dispatcher.spill.set_slo(m.model_group, m.slo)
            if m.lora is not None and state.adapters is not None:
                state.adapters.add_base(m.lora)
                for adapter in m.adapters:
                    state.adapters.add(adapter)
        self.manager.subscribe(follow(state.registry, ids, asyncio.get_running_loop()))
        manager = self.manager
        await manager.adopt_kept()  # engines `vstack down` kept asleep: sleeping, woken by the switch below
        for m in self.engines:
            slot = manager.slots[m.model_group]
            if m.preload and slot.state != ModelState.SLEEPING:  # starting at once: a request waits, not 404/503
                manager.move(slot, ModelState.STARTING, "starting")
        for m in self.engines:
            if m.preload:
                manager.request_switch(m.model_group)
        self._watch = asyncio.create_task(watch(manager), name="manager watch")
        return manager

    async def stop(self, state: GatewayState) -> None:
        """on_shutdown hook (after uvicorn drained the in-flight requests): stop every engine."""
        if self._watch is not None:
            self._watch.cancel()
        keep = self.keep_engines()
        notes = await self.manager.shutdown(keep_engines=keep, keep_asleep=not keep and self.keep_asleep())
        self.report_down(notes)
        for m in self.engines:
            state.registry.set_state(m.deployment_id, "stopped", "gateway shutting down" + (", engine kept" if keep
                                                                                            else ""))  # fmt: skip


def follow(registry: DeploymentRegistry, ids: dict[str, str],
           loop: asyncio.AbstractEventLoop | None = None) -> Callable[[Slot, ModelState, ModelState], None]:
    """The manager's state changes, written into the gateway's routing table: the state, its detail, and
    the engine's address (a cold start gets a fresh port; a container reached by IP has one once ready).
    A runtime with replicas (stack.engine.ray_runtime) adds one deployment per replica, kept in step with
    its replica events (heard on its watch thread, applied on `loop`)."""
    heard: set[int] = set()

    def on_change(slot: Slot, before: ModelState, after: ModelState) -> None:
        dep_id = ids[slot.name]
        if after in (ModelState.STARTING, ModelState.READY):
            registry.update(dep_id, api_base=slot.runtime.spec.base_url, engine_key=engine_key(slot.runtime))
        registry.set_state(dep_id, str(after), slot.detail)  # type: ignore[arg-type]
        runtime = slot.runtime
        if not has_replicas(runtime):
            return
        if id(runtime) not in heard and loop is not None:
            heard.add(id(runtime))

            def later(replicas: list[dict], slot: Slot = slot, runtime: object = runtime) -> None:
                if slot.runtime is runtime:  # a replaced set's late events are not this model's any more
                    with contextlib.suppress(RuntimeError):  # the loop closed: the gateway is gone
                        loop.call_soon_threadsafe(sync_replicas, registry, dep_id, slot, replicas)

            runtime.subscribe(later)  # type: ignore[attr-defined]
        sync_replicas(registry, dep_id, slot, runtime.replicas())  # type: ignore[attr-defined]

    return on_change


def has_replicas(runtime: object) -> bool:
    return callable(getattr(runtime, "replicas", None)) and callable(getattr(runtime, "subscribe", None))


REPLICA_STATE = {"ready": "ready", "starting": "starting", "lost": "failed", "stopped": "stopped"}


def sync_replicas(registry: DeploymentRegistry, set_id: str, slot: Slot, replicas: list[dict]) -> None:
    """One deployment per replica (`<set>-r<i>`, labels replica and node): routable while it is ready."""
    parent = registry.get(set_id)
    if parent is None:
        return
    stopped = slot.state in (ModelState.STOPPING, ModelState.STOPPED)
    for r in replicas:
        rid = f"{set_id}-r{r['replica']}"
        state = "stopped" if stopped else REPLICA_STATE.get(r["state"], "failed")
        labels = {**{k: v for k, v in parent.labels.items() if k != "role"}, "replica": str(r["replica"]),
                  "node": r["node"]}  # fmt: skip
        if r.get("phase"):  # a disaggregated model's prefill or decode engine (adr/0052)
            labels["phase"] = r["phase"]
        if r.get("kv_events"):  # its engine publishes its KV events (gateway.replica_routing: kv_events)
            labels.update(kv_events=r["kv_events"], kv_replay=r.get("kv_replay") or "")
        dep = registry.get(rid)
        if dep is None:
            registry.add(Deployment(id=rid, model_group=parent.model_group, kind="local",
                                    upstream_model=parent.upstream_model, api_base=r["url"] or None, state=state,
                                    detail=r["detail"], labels=labels, engine_key=parent.engine_key))  # fmt: skip
            continue
        registry.update(rid, api_base=r["url"] or None, labels=labels, engine_key=parent.engine_key)
        if dep.state != state or dep.detail != r["detail"]:
            registry.set_state(rid, state, r["detail"])
