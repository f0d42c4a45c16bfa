"""From a planned model to the engine the manager runs: its runtime (a child process, a container, Ray replicas)
and a factory of fresh ones, the default's engine started early, the supervisor of them all."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from stack.assemble.planning import PLAN_SECRETS_ENV, Launch, fetches_models
from stack.config.schema import StackConfig
from stack.config.sections.manager import ManagerConfig
from stack.engine.kept import (
    keep_asleep_requested,
    keep_requested,
    reattach,
    stop_leftovers,
    write_down_report,
)
from stack.engine.launch import engine_spec, log_path_for
from stack.engine.ports import free_port
from stack.engine.process import EngineSpec
from stack.engine.records import engine_records
from stack.engine.runtime import LocalEngine, Runtime, with_port
from stack.planner.kv_events_args import publishes
from stack.planner.plans import ModelPlan
from stack.planner.stack_planner import ray_demand
from stack.vllm.plugins.handoff import HandoffBroker

if TYPE_CHECKING:
    # the gateway's modules (FastAPI, LiteLLM: seconds) load only once the engine has started
    from stack.engine.early_spawn import EarlyEngine
    from stack.gateway.engines import EngineSupervisor, ManagedEngine
    from stack.gateway.routing.adapters import Adapter, Base
    from stack.manager.memory import MemoryProbe
    from stack.manager.policy import Capacity

ATTACHED_READY_S = 900.0  # a restarted engine service compiling or loading a large model: minutes


def serve_target(cfg: StackConfig, plan: ModelPlan) -> str:
    """What an engine container would plan itself for when it cannot run the handed plan: the profile, or
    the model on the hardware it detects (a model served by its Hub id by that id)."""
    if plan.ad_hoc:
        return plan.model.source.hub or plan.model.source.path or plan.model.name
    return plan.profile if plan.profile in cfg.profiles else plan.model.name


def runtime_pair(launch: Launch, plan: ModelPlan, kept: bool = True) -> tuple[Runtime, Callable[[], Runtime]]:
    """The engine for this plan and a factory of fresh ones (each cold start): a child process on a free
    loopback port, (manager.runtime: docker) a container placed by the site, or (ray) replicas on the nodes
    the plan chose (a fresh set is placed again on the cluster as it is then)."""
    cfg, cluster, site = launch.cfg, launch.plan.cluster, launch.site
    socket = launch.handoff.path if launch.handoff else None
    if cluster is not None:
        from stack.engine.ray_runtime import RayReplicaSet

        spec, demand = engine_spec(plan, log_path_for(cfg, plan)), ray_demand(cfg, plan)
        gpu = plan.accelerator == "gpu"
        phases = plan.disaggregation.phases() if plan.disaggregation is not None else ()
        made = RayReplicaSet(spec, cluster.of(demand.model), demand, cfg.manager.ray, gpu, phases)
        return made, lambda: RayReplicaSet(spec, [], demand, cfg.manager.ray, gpu, phases)
    if site is None:
        records, fingerprint = engine_records(cfg.state_dir), plan.fingerprint
        engine = LocalEngine(engine_spec(plan, log_path_for(cfg, plan), handoff_socket=socket), records, fingerprint)
        note = reattach(engine, cfg.stop_grace_s) if kept else ""
        if note:
            logging.getLogger("stack.gateway").info("%s", note)
        return local_pair(engine)
    import json

    from stack.engine.docker_runtime import DockerEngine

    container = site.container_for(serve_target(cfg, plan), plan.served_name, plan.accelerator == "gpu",
                                   plan.can_sleep)  # fmt: skip
    # The container runs this plan (when its vLLM is the plan's and the files are in the shared cache); its
    # secrets travel in its environment, as HF_TOKEN does.
    container.plan = json.dumps(plan.public(), separators=(",", ":"))
    secrets = plan.secrets()
    if secrets:
        container.env[PLAN_SECRETS_ENV] = json.dumps(secrets)
    container.health_interval_s = 5.0
    return DockerEngine(container, site.client), lambda: DockerEngine(replace(container), site.client)


def local_pair(engine: LocalEngine) -> tuple[Runtime, Callable[[], Runtime]]:
    """A local engine and the factory of fresh ones: the first start is this engine's (maybe running already:
    kept, or started early), each later one a new process on a free port."""
    first: list[Runtime] = [engine]
    return engine, lambda: first.pop() if first else LocalEngine(with_port(engine.spec, free_port()), engine.records,
                                                                   engine.fingerprint)  # fmt: skip


def adopt_early(launch: Launch, early: EarlyEngine) -> tuple[Runtime, Callable[[], Runtime]] | None:
    """The engine the gateway process spawned before its imports, as the default's runtime, when it runs the
    plan's own command (its port and key were drawn by `vstack up`); None, with the early process stopped,
    when it does not, when it could not spawn, or when an engine of that name is there to re-attach."""
    log = logging.getLogger("stack.gateway")
    plan, cfg = launch.plan.default, launch.cfg
    spec = EngineSpec(**{**early.spec, "log_path": Path(early.spec["log_path"]),
                         "drop_env": tuple(early.spec["drop_env"])})  # fmt: skip
    planned = engine_spec(plan, log_path_for(cfg, plan), port=spec.port)
    why = early.error or ("" if (planned.argv, planned.env, planned.log_path) == (spec.argv, spec.env, spec.log_path)
                          else "its command is not the plan's")  # fmt: skip
    engine = LocalEngine(spec, engine_records(cfg.state_dir), plan.fingerprint)
    if not why:
        note = reattach(engine, cfg.stop_grace_s)  # an engine of that name to take over, or a dead one's record
        if engine.kept is not None:
            why = note
        elif note:
            log.info("%s", note)
    if why or early.popen is None:
        early.stop(cfg.stop_grace_s)
        log.warning("early spawn of engine %s not used (%s): starting it as usual", spec.name, why)
        return None
    engine.popen, engine.log_start = early.popen, early.log_start
    engine.prestarted = True  # type: ignore[attr-defined]
    engine.save_record(early.popen.pid, early.started_at)
    early.adopted = True
    return local_pair(engine)


def managed(launch: Launch, plan: ModelPlan, preload: bool,
            pair: tuple[Runtime, Callable[[], Runtime]] | None = None) -> ManagedEngine:  # fmt: skip
    from stack.gateway.engines import ManagedEngine
    from stack.manager.memory import engine_need, engine_weights, pinned_gpus
    from stack.planner.stack_planner import gpus_per_engine

    engine, factory = pair or runtime_pair(launch, plan)
    need, source = engine_need(plan.fit)
    weights_gpu, weights_host = engine_weights(plan.fit)
    if launch.plan.cluster is not None:
        need, source = 0, "placed on the Ray cluster (stack.planner.cluster)"  # not this machine's memory
    if fetches_models(launch.plan.site) and not Path(plan.model_arg).is_dir():
        # Its files could not be fetched: it will fail at once, so it must not evict a working model.
        need, source = 0, "model files missing"
    served = plan.served_name
    lora, adapters = lora_of(plan)
    return ManagedEngine(engine, served, served, factory=factory, need=need, need_source=source,
                         can_sleep=plan.can_sleep, weights_gpu=weights_gpu, weights_host=weights_host,
                         preload=preload, task=plan.model.task, lora=lora, adapters=adapters,
                         keeps_host_copy=plan.keeps_host_copy, slo=list(plan.slo),
                         prefix_cache_bytes=plan.prefix_cache_bytes,
                         scheduling=str(plan.engine.get("scheduling_policy") or ""),
                         gpus=pinned_gpus(plan.env, gpus_per_engine(plan)) if plan.accelerator == "gpu" else None,
                         **replica_routing(launch, plan))  # fmt: skip


def replica_routing(launch: Launch, plan: ModelPlan) -> dict[str, str]:
    """A Ray model's own replica routing (gateway.replica_routing_models) and, when its engines publish their KV
    events, its folder: the gateway tokenizes prompts with its tokenizer."""
    if launch.plan.cluster is None:
        return {}
    own = launch.plan.config.gateway.replica_routing_models
    routing = next((own[n] for n in (plan.profile, plan.model.name, plan.served_name) if n in own), "")
    publishing = publishes(list(plan.args)) and Path(plan.model_arg).is_dir()
    return {"replica_routing": routing, "model_path": plan.model_arg if publishing else ""}


def lora_of(plan: ModelPlan) -> tuple[Base | None, list[Adapter]]:
    """The engine's LoRA limits and the adapters of its model config (stack.gateway.routing.adapters)."""
    from stack.gateway.routing.adapters import Base, adapter_from_info

    engine = plan.engine
    if not engine.get("enable_lora"):
        return None, []
    served = plan.served_name
    base = Base(served, int(engine.get("max_lora_rank") or 16), int(engine.get("max_loras") or 1),
                int(engine.get("max_cpu_loras") or engine.get("max_loras") or 1),
                plan.model.lora.runtime_updates, plan.model)  # fmt: skip
    return base, [adapter_from_info(info, served) for info in plan.adapters]


# Without manager settings the supervisor behaves as it always did: every engine starts at once, shares
# the machine, and one that dies is marked failed (no restarts, no idle unloading).
PLAIN = ManagerConfig(restart_max=0, idle_ttl_s=0, sleep="off", spill_to_fallback=True)


def engine_supervisor(engines: list[ManagedEngine], startup_timeout_s: float, stop_grace_s: float,
                      settings: ManagerConfig | None = None, capacity: Capacity | None = None,
                      probe: MemoryProbe | None = None, retry_after_s: int = 5) -> EngineSupervisor:  # fmt: skip
    """The model manager of these engines (a slot each) and the gateway's supervisor of it, built here, in the
    composition root: the gateway is handed the manager, it does not build one."""
    from stack.gateway.engines import EngineSupervisor
    from stack.manager.manager import ModelManager
    from stack.manager.policy import Capacity
    from stack.manager.slot import Slot

    slots = [Slot(m.model_group, m.engine, m.factory, m.need, m.need_source, m.can_sleep,
                  weights_gpu=m.weights_gpu, weights_host=m.weights_host, keeps_host_copy=m.keeps_host_copy,
                  prefix_cache_bytes=m.prefix_cache_bytes, gpus=m.gpus)
             for m in engines]  # fmt: skip
    manager = ModelManager(
        slots, settings or PLAIN, capacity or Capacity(total=1 << 62, sleep_supported=False), probe=probe,
        startup_timeout_s=startup_timeout_s, stop_grace_s=stop_grace_s, retry_after_s=retry_after_s,
    )  # fmt: skip
    return EngineSupervisor(engines, manager)


def supervisor(launch: Launch) -> EngineSupervisor:
    from stack.manager.memory import NvmlProbe, capacity_bytes, host_budget_bytes
    from stack.manager.policy import Capacity

    plan, cfg, hardware = launch.plan, launch.cfg, launch.plan.hardware
    preload = set(cfg.manager.preload or [])
    wanted = lambda p: not preload or p.served_name in preload or p.model.name in preload  # noqa: E731
    if launch.early is None:
        launch.handoff = launch.handoff or handoff_broker(launch)
    engines = [managed(launch, plan.default, True, launch.early)] + [
        managed(launch, p, bool(preload) and wanted(p)) for p in plan.others
    ]
    sleep = any(e.can_sleep for e in engines)
    capacity = Capacity(capacity_bytes(cfg.manager, hardware), sleep_supported=sleep,
                        host_budget=host_budget_bytes(cfg.manager, hardware, len(engines)))  # fmt: skip
    sup = engine_supervisor(engines, cfg.startup_timeout_s, cfg.stop_grace_s, cfg.manager, capacity,
                            NvmlProbe() if hardware.gpus else None, cfg.gateway.retry_after_s)  # fmt: skip
    sup.manager.handoff = launch.handoff
    sup.keep_engines = lambda: keep_requested(cfg.state_dir)
    sup.keep_asleep = lambda: keep_asleep_requested(cfg.state_dir)
    sup.report_down = lambda notes: write_down_report(cfg.state_dir, notes)
    if launch.site is None and plan.cluster is None:  # kept engines of models this configuration no longer serves
        spare = frozenset(m.engine.spec.name for m in engines)
        for record in stop_leftovers(cfg.state_dir, cfg.stop_grace_s, spare)[0]:
            logging.getLogger("stack.gateway").info("engine %r (pid %d) is not in this configuration: stopped it",
                                                    record.name, record.pid)  # fmt: skip
    return sup


def attached_supervisor(
    upstreams: list[tuple[str, str, str]], manager: ManagerConfig, retry_after_s: int = 5
) -> EngineSupervisor:
    """Each upstream an attached engine of the model manager; it may sleep if the engine says it can."""
    from stack.engine.attached import AttachedEngine, AttachedSpec
    from stack.gateway.engines import ManagedEngine
    from stack.manager.policy import Capacity

    engines = []
    for model, url, served in upstreams:
        engine = AttachedEngine(AttachedSpec(served, url))
        engines.append(ManagedEngine(engine, model, served, need=0, need_source="its own compose service",
                                     can_sleep=engine.supports_sleep()))  # fmt: skip
    sleep = any(e.can_sleep for e in engines)
    # Compose placed every engine already: memory is not the manager's to budget, only idleness.
    return engine_supervisor(
        engines, ATTACHED_READY_S, 0, manager, Capacity(1 << 62, sleep_supported=sleep), retry_after_s=retry_after_s
    )


def handoff_broker(launch: Launch) -> HandoffBroker | None:
    """The broker through which a sleeping engine's GPU memory goes to the engine waking in its place, where
    the plan decided it (stack.planner.stack_planner.decide_handoff); its socket goes into the environment
    of every engine planned with it."""
    handed = [p for p in launch.plan.models if p.handoff]
    if not handed:
        return None
    broker = HandoffBroker().start()
    logging.getLogger("stack.gateway").info("sleep handoff: GPU memory handed between %d engines through %s",
                                            len(handed), broker.path)  # fmt: skip
    return broker


def start_early(launch: Launch) -> None:
    """Spawn the default model's engine before the gateway's modules load (FastAPI, LiteLLM's ~3 s import):
    they load while the engine loads its weights. The manager's first start of it then finds it running.
    Local engines only (a container or a Ray replica is placed by the manager)."""
    if launch.site is not None or launch.plan.cluster is not None:
        return
    launch.handoff = handoff_broker(launch)  # its socket goes into the engine's environment
    log = logging.getLogger("stack.gateway")
    adopted = adopt_early(launch, launch.early_spawn) if launch.early_spawn is not None else None
    if adopted is not None:
        launch.early, spawned = adopted, launch.early_spawn.started_at  # type: ignore[union-attr]
        pid = adopted[0].popen.pid  # type: ignore[attr-defined]
    else:
        launch.early = runtime_pair(launch, launch.plan.default)
        try:
            pid = launch.early[0].start()
            launch.early[0].prestarted = True  # type: ignore[attr-defined]
        except OSError as exc:  # the manager's start tries again and reports it
            log.warning("early start of the default engine failed: %s", exc)
            return
        spawned = time.time()
    # Where a start's seconds go before vLLM's own (the startup bench reads this line).
    ago = time.time() - spawned
    said = f" (before its imports, {ago:.2f} s before this line)" if adopted else ""
    log.info("engine %s (pid %d) spawned %.2f s after the gateway process began%s", launch.plan.default.served_name,
             pid, process_age() - ago, said)  # fmt: skip


def process_age() -> float:
    """Seconds since this process began, from the kernel's own clocks: psutil's create_time adds /proc/stat's
    boot time, a whole second, so it can be up to 1 s off (it read 1.0 s where the spawn took 0.1 s)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        import psutil

        return time.time() - psutil.Process().create_time()


def shutdown_hooks(sup: EngineSupervisor) -> list:
    """What the gateway runs once it has drained, in order: the engines stopped (or kept, adr/0030), then the
    memory-handoff broker closed (no engine is left to hand memory to). Each is awaited with the state."""
    broker = sup.manager.handoff

    async def close_handoff(_state: object) -> None:
        broker.stop()  # type: ignore[union-attr]

    return [sup.stop, *([close_handoff] if broker is not None else [])]
