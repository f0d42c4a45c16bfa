"""The composition root: the one place that turns a configuration into a plan, and a plan into a gateway.

    plan = plan_up(cfg, target)                 # inputs gathered once: hardware, vLLM options, Docker, Ray
    app, sup = build_gateway(Launch(plan))      # the FastAPI app and the supervisor of its engines
    serve(Launch(plan), port)                   # both, until SIGTERM; EngineError if the default fails to start

`vstack up` plans in its own process and hands the plan to the gateway process it starts
(`python -m stack.entrypoints.up --plan FILE`), which serves it without loading the configuration or
detecting the hardware again; `vstack up -f` does both in one process; the compose gateway (no --plan)
plans then serves. `vstack tune`, `vstack plan` and the engine container's entry plan through `plan_up` too,
so no entry point can choose settings the others would not.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from stack.config.schema import StackConfig
from stack.config.sections.gateway import GatewayConfig
from stack.config.sections.manager import ManagerConfig
from stack.engine.kept import (
    keep_asleep_requested,
    keep_requested,
    kept_pids,
    reattach,
    stop_leftovers,
    tree_pids,
    write_down_report,
)
from stack.engine.launch import engine_spec, free_port, log_path_for
from stack.engine.process import EngineSpec
from stack.engine.records import engine_records
from stack.engine.runtime import LocalEngine, Runtime, logs_of, with_port
from stack.errors import EngineError, StackError
from stack.hardware import HardwareInfo, detect
from stack.models import pull
from stack.planner.plans import ContainerSite, ModelPlan, StackPlan
from stack.planner.stack_planner import plan_stack, ray_demand
from stack.tracing.settings import Tracing
from stack.tracing.settings import resolve as resolve_tracing
from stack.vllm.plugins.handoff import HandoffBroker

if TYPE_CHECKING:  # the gateway's modules (FastAPI, LiteLLM: seconds) load only once the engine has started
    import uvicorn
    from fastapi import FastAPI

    from stack.engine.docker_site import Site
    from stack.engine.early_spawn import EarlyEngine
    from stack.gateway.console.sources import ConsoleSources
    from stack.gateway.engines import EngineSupervisor, ManagedEngine
    from stack.gateway.http.route_context import GatewayState
    from stack.gateway.routing.adapters import Adapter, Base
    from stack.vllm.options import VllmCatalog

Status = Callable[[str], None]
ATTACHED_READY_S = 900.0  # a restarted engine service compiling or loading a large model: minutes
PLAN_SECRETS_ENV = "VSTACK_PLAN_SECRETS"  # an engine container's ModelPlan secrets (stack.entrypoints.engine_container)


def plan_up(cfg: StackConfig, target: str | None, *, on_status: Status = print, hardware: HardwareInfo | None = None,
            catalog: VllmCatalog | None = None, fetch: bool = True, overrides: dict | None = None) -> StackPlan:
    """What `vstack up` will run: the inputs gathered once (the hardware, the installed vLLM's options, the
    Docker site, the Ray cluster's nodes) and every model planned once (stack.planner.stack_planner).
    fetch=False plans from the files at hand (`vstack plan`): nothing is downloaded. overrides: what the
    command line set (`cfg` has them already; the plan records them)."""
    from stack.vllm.families import registered_parsers
    from stack.vllm.options import engine_python, installed_catalog

    site = docker_site(cfg)  # checked before any model is fetched
    # The memory of engines an earlier gateway left running counts as free: they may be re-attached.
    hardware = hardware or detect(kept_pids(cfg.state_dir) if site is None else frozenset())
    python = engine_python(cfg.engine_python)
    catalog = catalog or installed_catalog(python, cfg.cache_dir)
    parsers = registered_parsers(python)  # the installed vLLM's parser tables, read once for every model
    nodes = None
    if cfg.manager.runtime == "ray":
        from stack.engine import ray_cluster

        ray_cluster.connect(cfg.manager.ray)
        nodes = ray_cluster.nodes()
    fetches = fetch and fetches_models(site)
    return plan_stack(cfg, target, hardware, catalog, site=site, nodes=nodes, on_status=on_status, parsers=parsers,
                      overrides=overrides, fetch=(lambda entry: pull(entry, cfg, on_status)) if fetches else None)


@dataclass
class Launch:
    """A StackPlan being served, and what serving it added: the Docker client (manager.runtime: docker),
    the sleep handoff's broker, the default model's engine started early."""

    plan: StackPlan
    site: Site | None = None  # the plan's ContainerSite with a Docker client
    handoff: HandoffBroker | None = None  # the sleep handoff's broker, once opened (start_early opens it)
    early: tuple[Runtime, Callable[[], Runtime]] | None = None  # the default's engine, started by start_early
    early_spawn: EarlyEngine | None = None  # the default's engine, spawned by the gateway process before its imports

    def __post_init__(self) -> None:
        if self.site is None and self.plan.site is not None:
            self.site = live_site(self.plan.site)

    @property
    def cfg(self) -> StackConfig:
        return self.plan.config


def live_site(described: ContainerSite) -> Site:
    """The planned Docker site with a client of this process (a client does not cross processes)."""
    from stack.engine.docker_site import Site, connect

    return Site(**asdict(described), client=connect())


def describe_site(site: Site) -> ContainerSite:
    return ContainerSite(**{f.name: getattr(site, f.name) for f in fields(ContainerSite)})


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
        made = RayReplicaSet(spec, cluster.of(demand.model), demand, cfg.manager.ray, gpu)
        return made, lambda: RayReplicaSet(spec, [], demand, cfg.manager.ray, gpu)
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


def docker_site(cfg: StackConfig) -> ContainerSite | None:
    """manager.runtime: docker: where engine containers go, checked before anything starts."""
    if cfg.manager.runtime != "docker":
        return None
    from stack.config.loader import builtin_config_dir
    from stack.engine.docker_site import connect, discover

    # Its warnings stay with it: the gateway logs them when it serves the plan (build_gateway).
    return describe_site(discover(cfg.manager.docker, connect(), builtin_config_dir(), cfg.cache_dir))


def managed(launch: Launch, plan: ModelPlan, preload: bool,
            pair: tuple[Runtime, Callable[[], Runtime]] | None = None) -> ManagedEngine:  # fmt: skip
    from stack.gateway.engines import ManagedEngine
    from stack.manager.memory import engine_need, engine_weights

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
                         scheduling=str(plan.engine.get("scheduling_policy") or ""))  # fmt: skip


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


def supervisor(launch: Launch) -> EngineSupervisor:
    from stack.gateway.engines import EngineSupervisor
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
    sup = EngineSupervisor(engines, cfg.startup_timeout_s, cfg.stop_grace_s, cfg.manager, capacity,
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


class Reloader:
    """`vstack reload` inside the running gateway: the configuration read again and planned; an engine whose
    fingerprint (ModelPlan.fingerprint) changed is drained, stopped and started from its new plan in the
    background, while every other engine keeps serving. Models added or removed, gateway settings and
    other runtimes than local processes are not changed by a reload: it says so."""

    def __init__(self, launch: Launch, sup: EngineSupervisor, profile: str | None,
                 config: str | None) -> None:  # fmt: skip
        self.launch, self.sup, self.profile, self.config = launch, sup, profile, config
        self._lock = asyncio.Lock()
        # `engine_python` given to POST /admin/reload (`vstack upgrade apply`): kept for later reloads.
        self.overrides: dict[str, str] = {}

    async def __call__(self, engine_python: str | None = None) -> dict:
        from stack.gateway.openai_errors import InvalidRequest

        async with self._lock:
            try:
                if engine_python is not None:
                    self.overrides["engine_python"] = allowed_engine_python(engine_python, self.launch.cfg)
                new = await asyncio.to_thread(self._plan)
            except StackError as exc:  # nothing was changed: the running engines keep serving
                raise InvalidRequest(f"reload: {exc.message}" + (f" ({exc.hint})" if exc.hint else ""),
                                     param=None) from None  # fmt: skip
            return self._apply(new)

    def _plan(self) -> StackPlan:
        from stack.config import load_config
        from stack.errors import ConfigError

        # the command line's overrides (--force) apply again, and an engine Python `vstack upgrade apply` gave
        overrides = {**(self.launch.plan.overrides or {}), **self.overrides} or None
        cfg = load_config(self.config, overrides=overrides)  # a reload reads the configuration again: its purpose
        if cfg.manager.runtime != "local":
            raise ConfigError(f"manager.runtime: {cfg.manager.runtime}: reload restarts local engine processes only",
                              hint="`vstack down && vstack up`")  # fmt: skip
        running = set().union(*(tree_pids(pid) for s in self.sup.manager.slots.values()
                                if (pid := getattr(s.runtime, "pid", None))))  # fmt: skip
        return plan_up(cfg, self.profile, on_status=lambda m: logging.getLogger("stack.gateway").info("%s", m),
                       hardware=detect(frozenset(running)), overrides=overrides)  # fmt: skip

    def _apply(self, new: StackPlan) -> dict:
        from stack.manager.memory import engine_need, engine_weights

        manager, log = self.sup.manager, logging.getLogger("stack.gateway")
        plans = {p.served_name: p for p in new.models}
        kept, restarted = [], []
        not_applied = [f"{n}: added; a new model needs `vstack down && vstack up`" for n in plans
                       if n not in manager.slots]  # fmt: skip
        not_applied += [f"{n}: removed from the configuration; still served until `vstack down`"
                        for n in manager.slots if n not in plans]  # fmt: skip
        if new.config.gateway != self.launch.cfg.gateway:
            not_applied.append("gateway settings changed: they apply on the next `vstack up`")
        applied = Launch(new, handoff=self.launch.handoff)
        for name, plan in plans.items():
            slot = manager.slots.get(name)
            if slot is None:
                continue
            if getattr(slot.runtime, "fingerprint", None) == plan.fingerprint:
                kept.append(name)
                continue
            _engine, slot.factory = runtime_pair(applied, plan, kept=False)
            slot.need, slot.need_source = engine_need(plan.fit)
            slot.weights_gpu, slot.weights_host = engine_weights(plan.fit)
            restarted.append(name)
            task = asyncio.get_running_loop().create_task(self._restart(name), name=f"reload {name}")
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self.launch = replace(self.launch, plan=self.launch.plan.model_copy(update={"config": new.config}))
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


def allowed_engine_python(python: str, cfg: StackConfig) -> str:
    """A reload may move engines only to a Python the stack knows: the configured one, or a candidate venv that
    `vstack upgrade check` built under cache_dir/upgrade/venvs (the admin API never runs an arbitrary program)."""
    from stack.errors import ConfigError
    from stack.vllm.cache_root import absolute, candidate_venvs

    path, venvs = absolute(python), absolute(candidate_venvs(cfg.cache_dir))
    known = {absolute(p) for p in (cfg.engine_python, sys.executable) if p}
    inside = venvs in path.parents and path.parent.name == "bin" and path.name.startswith("python")
    if (path in known or inside) and path.is_file():
        return python
    raise ConfigError(f"engine_python {python!r}: not the configured engine Python nor a candidate venv under {venvs}",
                      hint="build one with `vstack upgrade check VERSION`")


def shutdown_hooks(sup: EngineSupervisor) -> list:
    """What the gateway runs once it has drained, in order: the engines stopped (or kept, adr/0030), then the
    memory-handoff broker closed (no engine is left to hand memory to). Each is awaited with the state."""
    broker = sup.manager.handoff

    async def close_handoff(_state: object) -> None:
        broker.stop()  # type: ignore[union-attr]

    return [sup.stop, *([close_handoff] if broker is not None else [])]


def build_gateway(launch: Launch, on_startup: list | None = None,
                  reload_from: tuple[str | None, str | None] | None = None,
                  console: ConsoleSources | None = None,
                  admin_token_file: Path | None = None) -> tuple[FastAPI, EngineSupervisor]:  # fmt: skip
    """The gateway app owning the planned engines (started by its startup hook, stopped on shutdown).
    reload_from: (profile, config file) it was started from: `vstack reload` reads them again. console: what
    the entry point adds to the console's Plan & config page (the patch ledger, reports). admin_token_file:
    without an admin key, where /admin's token is written (the serving process: state_dir/admin-token)."""
    from stack.gateway.app import create_app

    sup = supervisor(launch)
    warn_if_open(launch.cfg)
    log = logging.getLogger("stack.gateway")
    for note in launch.plan.notes:  # decided where the plan was made (`vstack up`'s process): said here too
        log.info("%s", note)
    for warning in launch.plan.site.warnings if launch.plan.site else []:
        log.warning("%s", warning)
    app = create_app(launch.cfg.gateway, default_model=launch.plan.default.served_name,
                     on_startup=[sup.start, *(on_startup or [])],
                     on_shutdown=shutdown_hooks(sup),
                     manager=sup.manager, state_file=launch.cfg.state_dir / "runtime.json",
                     console=console_sources(launch.plan, console, lambda name: engine_port(sup, name)),
                     admin_token_file=admin_token_file,
                     tracing=resolve_tracing(launch.cfg.observability.tracing))  # fmt: skip
    if reload_from is not None and launch.site is None and launch.plan.cluster is None:
        app.state.gateway.reload = Reloader(launch, sup, *reload_from)
    return app, sup


def engine_port(sup: EngineSupervisor, name: str) -> int | None:
    """The port a model's engine listens on now (None: not known, e.g. never started)."""
    slot = sup.manager.slots.get(name)
    port = getattr(getattr(getattr(slot, "runtime", None), "spec", None), "port", None)
    return port if isinstance(port, int) and port > 0 else None


def serve_line(plan: ModelPlan, port: int | None) -> str:
    """`vllm serve ...` as the engine runs it: its real port, or (a plan's port 0: a free one at each start)
    a placeholder that says so, never `--port 0`, which vLLM would take literally."""
    if port is not None or plan.port:
        return plan.display(port=port)
    return plan.display(port=0).replace(" --port 0 ", " --port <a free port, picked at start> ", 1)


def console_sources(plan: StackPlan, extra: ConsoleSources | None = None,
                    port_of: Callable[[str], int | None] = lambda _name: None) -> ConsoleSources:  # fmt: skip
    """The console's view of what was planned: the effective configuration (masked as `vstack config render`
    masks), each model's fit with the planner's reasons, its `vllm serve` line (with the port its engine has
    now: `port_of`) and its whole ModelPlan (the JSON `vstack plan --json` prints of it); `extra` adds the rest."""
    from stack.config.redact import redacted_dump
    from stack.gateway.console.sources import ConsoleSources
    from stack.manager.tiers import bus_for

    masked = redacted_dump(plan.config)

    def engines() -> list[dict]:
        return [{"model": p.served_name, "profile": p.profile, "default": p is plan.default,
                 "command": serve_line(p, port_of(p.served_name)), "notes": list(p.notes), "fit": fit_view(p),
                 "plan": p.public()}
                for p in plan.models]  # fmt: skip

    gpus = plan.hardware.gpus
    extra = extra or ConsoleSources()
    return replace(extra, config=lambda: masked, engines=engines,
                   bus_h2d_gbps=bus_for(gpus[0].name).h2d_gbps if gpus else None)  # fmt: skip


def fit_view(plan: ModelPlan) -> dict | None:
    fit = plan.fit
    if fit is None:
        return None
    return {"hardware": fit.hardware,
            "summary": f"{fit.max_concurrency:.1f} requests of {fit.max_model_len:,} tokens at once, "
                       f"{fit.kv_tokens:,} KV tokens",
            "decisions": [{"key": d.key, "value": d.value if isinstance(d.value, int | float | bool | str)
                           else str(d.value), "source": d.source, "reason": d.reason}
                          for d in fit.decisions]}  # fmt: skip


def serve(launch: Launch, port: int, reload_from: tuple[str | None, str | None] | None = None,
          console: ConsoleSources | None = None) -> int:
    """Run the gateway with its engines until SIGTERM/SIGINT (0). EngineError, with the engine's log tail,
    if the default model's engine fails to start: that ends `up` (a later crash only marks it failed)."""
    from stack.gateway.log_health import install

    log_handler = install(logging.INFO)  # basicConfig's handler, watched for lines a full disk loses
    start_early(launch)

    from stack.gateway.http.serve import GatewayServer, uvicorn_config

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

    from stack.manager.admin_token import token_path

    app, sup = build_gateway(launch, on_startup=[watch_start], reload_from=reload_from, console=console,
                             admin_token_file=token_path(launch.cfg.state_dir))
    app.state.gateway.watch_log(log_handler)
    cfg = launch.cfg
    server = GatewayServer(uvicorn_config(app, cfg.gateway.host, port, cfg.gateway.drain_grace_s, "info",
                                          limits=cfg.gateway))
    end_console_streams_on_exit(server, app)
    try:
        server.run()
    finally:
        if not server.started and launch.early is not None:  # never served (the port taken...): no shutdown
            launch.early[0].stop(cfg.stop_grace_s)  # hook will stop the engine started early, so stop it here
    if failed:
        engine = sup.manager.slots[sup.engines[0].model_group].runtime
        log = getattr(engine.spec, "log_path", None) or f"docker logs {engine.spec.name}"
        raise EngineError(f"engine {launch.plan.default.served_name!r} {failed['message']}",
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
    from stack.gateway.http.auth import KeyRing, is_loopback

    if not is_loopback(cfg.gateway.host) and not KeyRing.from_refs(cfg.gateway.api_keys).enabled \
            and not cfg.gateway.tenants:
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
                        manage: bool, state_file: Path | None = None,
                        admin_token_file: Path | None = None, *,
                        tracing: Tracing | None = None) -> FastAPI:  # fmt: skip
    """A gateway in front of servers already running (`python -m stack.entrypoints.gateway`): each upstream
    (model, base URL, served name) a fixed deployment, or (manage) an attached engine of the model manager.
    state_file: where /admin changes are kept (with --config: state_dir/runtime.json); admin_token_file:
    where /admin's token is written without an admin key (with --config: state_dir/admin-token)."""
    from stack.gateway.app import create_app
    from stack.gateway.registry import Deployment, DeploymentRegistry

    default = upstreams[0][0] if upstreams else "default"
    if manage:
        sup = attached_supervisor(upstreams, manager, settings.retry_after_s)
        return create_app(settings, default_model=default, on_startup=[sup.start], on_shutdown=[sup.stop],
                          manager=sup.manager, state_file=state_file, admin_token_file=admin_token_file,
                          tracing=tracing)
    registry = DeploymentRegistry()
    for i, (model, url, served) in enumerate(upstreams):
        registry.add(Deployment(id=f"local-{i + 1}", model_group=model, kind="local", upstream_model=served,
                                api_base=url))  # fmt: skip
    return create_app(settings, default_model=default, registry=registry, state_file=state_file,
                      admin_token_file=admin_token_file, tracing=tracing)


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
