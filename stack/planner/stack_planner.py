"""Every model of one `vstack up` planned once: the StackPlan.

    plan = plan_stack(cfg, target, hardware, catalog, fetch=..., site=..., nodes=...)

The inputs are handed in by the composition root (stack.assemble.planning.plan_up): the configuration (loaded once),
the hardware (detected once), the installed vLLM's option catalogue, where engine containers go (a
ContainerSite, manager.runtime: docker) and the Ray cluster's live nodes (manager.runtime: ray). `fetch`
makes a model's files local (stack.models.pull); without it, models are planned from the files at hand or
the Hub's metadata, as `vstack plan` and engines that fetch for themselves do.

Each model is planned once: from its files when they are on this machine already (fetching them would change
nothing); otherwise first from the Hub's metadata (a model that cannot fit is refused before any download),
then again from the files the download brought (exact weight bytes), which its notes say.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from stack.config.schema import ModelEntry, StackConfig
from stack.errors import ConfigError, StackError
from stack.hardware import HardwareInfo
from stack.models import ModelFiles
from stack.planner import data_parallel
from stack.planner.cluster import Demand, NodeRes, Placement, check, place
from stack.planner.gpu_placement import place_on_gpus
from stack.planner.model_planner import plan_model, with_fingerprint
from stack.planner.plans import ContainerSite, ModelPlan, RunsOn, StackPlan, VllmBuild
from stack.planner.serving import LOOK_UP
from stack.vllm.families import Registered
from stack.vllm.options import VllmCatalog

Status = Callable[[str], None]
Fetch = Callable[[ModelEntry], ModelFiles]
UNCONFIGURED = "not in configs/models:"  # the line `vstack up` repeats after ready (stack.cli.lifecycle)
REPLANNED = "planned again from the files fetched just now (first from the Hub's metadata, before the download)"


def plan_stack(cfg: StackConfig, target: str | None, hardware: HardwareInfo, catalog: VllmCatalog, *,
               fetch: Fetch | None = None, site: ContainerSite | None = None, nodes: list[NodeRes] | None = None,
               parsers: Registered | str | None = LOOK_UP, overrides: dict | None = None,
               on_status: Status = lambda _s: None) -> StackPlan:  # fmt: skip
    """The default model (`target`, else `serve:`) and the manager's other models, each planned once; where
    each engine runs; the sleep handoff between them. Raises what the default model's planning raises.
    overrides: what the command line set over the configuration, recorded (a reload applies them again).
    parsers: the vLLM's registered parsers (stack.vllm.families.registered_parsers), read once by the caller."""
    cfg, notes = with_sleep(cfg, hardware)
    default = plan_fetched(cfg, target, hardware, catalog, fetch, on_status, parsers)
    others = plan_others(cfg, default, hardware, catalog, fetch, on_status, parsers) if cfg.manager.models else []
    models, placement_note = place_on_gpus(cfg, [default, *others], len(hardware.gpus or []), catalog)
    models, handoff_note = decide_handoff(cfg, models, catalog)
    notes += [n for n in (placement_note, handoff_note) if n]
    cluster = None
    if cfg.manager.runtime == "ray":
        refuse_data_parallel_on_ray(models)
        cluster = place_on_cluster(cfg, models, nodes or [], on_status)
    models = [m.model_copy(update={"runs_on": runs_on(cfg, m, site, cluster)}) for m in models]
    for m in models:
        if m.ad_hoc:
            on_status(unconfigured_line(m))
    return StackPlan(target=target, overrides=overrides or {}, config=cfg, hardware=hardware,
                     vllm=VllmBuild(distribution=catalog.distribution, version=catalog.version),
                     models=tuple(models), site=site, cluster=cluster, notes=tuple(notes))  # fmt: skip


def plan_fetched(cfg: StackConfig, target: str | None, hardware: HardwareInfo, catalog: VllmCatalog,
                 fetch: Fetch | None, on_status: Status = lambda _s: None,
                 parsers: Registered | str | None = LOOK_UP) -> ModelPlan:  # fmt: skip
    """One model, its files fetched (with `fetch`) and planned again only when the download changed what it
    was planned from."""
    first = plan_model(cfg, target, hardware, catalog, parsers=parsers)
    if first.model_files is not None:  # its files are here: fetching them would change nothing
        return _noted(first, f"model: {first.model_files.path} ({first.model_files.origin})")
    if fetch is None:
        return _noted(first, "model: not on this machine yet; planned from the Hub's metadata")
    files = fetch(first.model)
    plan = plan_model(cfg, target, hardware, catalog, files=files, fetched=True, parsers=parsers)
    return _noted(plan, f"model: {files.path} ({files.origin}); {REPLANNED}")


def _noted(plan: ModelPlan, note: str) -> ModelPlan:
    return plan.model_copy(update={"notes": (*plan.notes, note)})


def plan_others(cfg: StackConfig, default: ModelPlan, hardware: HardwareInfo, catalog: VllmCatalog,
                fetch: Fetch | None, on_status: Status = lambda _s: None,
                parsers: Registered | str | None = LOOK_UP) -> list[ModelPlan]:  # fmt: skip
    """The other models the manager may switch to. A model whose files cannot be fetched is still planned
    (from what is at hand): its engine then fails to start, and /admin/models shows why, without stopping
    `up`."""
    plans = []
    for name in cfg.manager.models:
        if name in (default.profile, default.served_name, default.model.name):
            continue  # the default model, planned already
        try:
            plan = plan_fetched(cfg, name, hardware, catalog, fetch, on_status, parsers)
        except StackError as exc:
            plan = plan_model(cfg, name, hardware, catalog, parsers=parsers)  # a fit or config error: raised again
            on_status(f"model {name} cannot be prepared: {exc.message}")
            plan = _noted(plan, f"model: not fetched ({exc.message})")
        if plan.served_name != default.served_name:
            plans.append(plan)
    return plans


def with_sleep(cfg: StackConfig, hardware: HardwareInfo) -> tuple[StackConfig, list[str]]:
    """Sleep mode on for every engine when the gateway may switch GPU models, or when `vstack down` keeps GPU
    engines asleep for the next `up` (manager.down_keeps_asleep, adr/0030). VLLM_SERVER_DEV_MODE opens
    debug endpoints too: safe only because engines bind to loopback (StackConfig.host checks it)."""
    switching = len(cfg.manager.models) >= 2
    if cfg.manager.sleep != "auto" or not hardware.gpus or not (switching or cfg.manager.down_keeps_asleep):
        return cfg, []
    served = cfg.model_copy(update={"engine": {**cfg.engine, "enable_sleep_mode": True},
                                    "env": {**cfg.env, "VLLM_SERVER_DEV_MODE": "1"}})  # fmt: skip
    why = "the gateway switches GPU models" if switching else "`vstack down` keeps it asleep for a restart in seconds"
    return served, [f"sleep mode on for every engine: {why} (manager.sleep: auto)"]


def model_gpus(engine: dict) -> int:
    """GPUs one copy of the model spans: tensor x pipeline parallel."""
    return data_parallel.rank_gpus(engine)


def gpus_per_engine(plan: ModelPlan) -> int:
    """GPUs one engine process group holds: its model's, times its data-parallel copies."""
    return data_parallel.engine_gpus(plan.engine)


def refuse_data_parallel_on_ray(plans: list[ModelPlan]) -> None:
    """A Ray replica is placed as one copy of the model (stack.planner.cluster): copies there are replicas."""
    wide = [p for p in plans if data_parallel.ranks(p.engine) > 1]
    if wide:
        where = lambda p: p.engine_origins.get("data_parallel_size", "engine.data_parallel_size")  # noqa: E731
        raise ConfigError([f"{where(p)}: data_parallel_size {data_parallel.ranks(p.engine)} with manager.runtime: ray"
                           for p in wide],
                          hint="on Ray, serve copies as manager.ray.replicas ({model: N}) and remove "
                               "data_parallel_size")  # fmt: skip


def devices_taken(plan: ModelPlan) -> tuple[str, ...]:
    """The devices an engine's ranks take, in rank order, as its CUDA_VISIBLE_DEVICES names them: its own, else the
    gateway's it inherits, else the first GPUs by index. So an engine pinned to "0" and one left unpinned on an
    unpinned gateway take the same GPU, and "0,1" for an engine of one GPU is "0". The handoff needs one device
    that every sleeping engine takes (the broker hands a piece only to an engine on the GPU it came from)."""
    count = gpus_per_engine(plan)
    value = plan.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if value is None:
        return tuple(str(i) for i in range(count))
    return tuple(d.strip() for d in value.split(",") if d.strip())[:count]


def decide_handoff(cfg: StackConfig, plans: list[ModelPlan], catalog: VllmCatalog
                   ) -> tuple[list[ModelPlan], str | None]:  # fmt: skip
    """manager.sleep_handoff: whether a sleeping engine's GPU memory goes to the engine waking in its place
    (the broker is the gateway's, stack.vllm.plugins.handoff). Local GPU engines only: a container or a Ray
    node cannot reach the gateway's socket. `auto` keeps to what was measured (engines of one GPU each,
    adr/0016); an engine on several GPUs needs `true`."""
    mode = cfg.manager.sleep_handoff
    sleepers = [p for p in plans if p.can_sleep]
    if mode is False or cfg.manager.runtime != "local" or len(sleepers) < 2:
        return plans, None
    pins = {devices_taken(p) for p in sleepers}
    if not set.intersection(*(set(x) for x in pins)):  # a piece of one GPU's memory cannot back another GPU's engine
        return plans, ("sleep handoff off: the engines are pinned to different GPUs (CUDA_VISIBLE_DEVICES "
                       f"{', '.join(sorted(repr(','.join(x)) for x in pins))}); memory is handed over only on one "
                       "GPU")  # fmt: skip
    if mode == "auto" and (wide := [p.profile for p in sleepers if gpus_per_engine(p) > 1]):
        return plans, (f"sleep handoff off: {', '.join(wide)} run on several GPUs each (measured on one-GPU engines "
                       "only; manager.sleep_handoff: true turns it on)")  # fmt: skip
    handed = [with_fingerprint(p, catalog, handoff=True) if p.can_sleep else p for p in plans]
    return handed, f"sleep handoff: GPU memory handed between {len(sleepers)} engines"


def replicas_of(cfg: StackConfig, plan: ModelPlan) -> int:
    """manager.ray.replicas names a model by its profile, model or served name; unnamed: 1."""
    if plan.disaggregation is not None:  # its prefill and decode engines (adr/0052)
        return plan.disaggregation.prefill + plan.disaggregation.decode
    wanted = cfg.manager.ray.replicas
    names = (plan.profile, plan.model.name, plan.served_name)
    return next((wanted[n] for n in names if n in wanted), 1)


def ray_demand(cfg: StackConfig, plan: ModelPlan) -> Demand:
    """What one model asks of the cluster: GPUs (tensor x pipeline parallel) or, on the CPU build, the
    host RAM the fit planner gave the engine (weights + KV space + overhead) and its Ray CPUs."""
    gpu = plan.accelerator == "gpu"
    pp = int(plan.engine.get("pipeline_parallel_size") or 1)
    devices = model_gpus(plan.engine) if gpu else 0
    need = plan.fit.budget.requested if plan.fit is not None else 0
    return Demand(plan.served_name, replicas_of(cfg, plan), devices, cfg.manager.ray.cpus_per_engine,
                  0 if gpu else int(need or 0), pp)  # fmt: skip


def place_on_cluster(cfg: StackConfig, plans: list[ModelPlan], nodes: list[NodeRes],
                     on_status: Status = lambda _s: None) -> Placement:  # fmt: skip
    """Every replica of every model on the Ray cluster's live nodes, or ClusterFitError naming what does
    not fit, before anything starts (stack.planner.cluster says the rule)."""
    refuse_split_beyond_gpus(cfg, plans, nodes)
    placement = check(place([ray_demand(cfg, p) for p in plans], nodes), nodes)
    for p in placement.places:
        on_status(f"ray: {p.model} replica {p.index} -> {p.reason}")
    return placement


def refuse_split_beyond_gpus(cfg: StackConfig, plans: list[ModelPlan], nodes: list[NodeRes]) -> None:
    """A disaggregated model's prefill + decode engines need their GPUs each: said with its own key, before the
    cluster's refusal names only replica numbers."""
    have = sum(int(n.gpus) for n in nodes if n.alive)
    for p in plans:
        split = p.disaggregation
        if split is None or p.accelerator != "gpu" or not nodes:
            continue
        need = ray_demand(cfg, p)
        if need.replicas * need.devices > have:
            raise ConfigError(f"disaggregation of {p.served_name}: {split.prefill} prefill + {split.decode} decode "
                              f"engines x {need.devices} GPU(s) need {need.replicas * need.devices} GPUs; the Ray "
                              f"cluster has {have} free", hint="lower prefill or decode (each at least 1), or add "
                              "GPU nodes to the cluster")  # fmt: skip


def runs_on(cfg: StackConfig, plan: ModelPlan, site: ContainerSite | None, cluster: Placement | None) -> RunsOn:
    if cluster is not None:
        places = cluster.of(plan.served_name)
        routing = cfg.gateway.replica_routing_of(plan.profile, plan.model.name, plan.served_name)
        phases = plan.disaggregation.phases() if plan.disaggregation is not None else ()
        role = lambda i: f" ({phases[i]})" if i < len(phases) else ""  # noqa: E731
        detail = "; ".join(f"replica {p.index}{role(p.index)}: {p.reason}" for p in places)
        detail += f"; {'decode choice' if phases else 'replica routing'}: {routing}"
        return RunsOn(kind="ray", detail=detail, nodes=tuple(n[:8] for p in places for n in p.nodes),
                      replica_routing=routing)  # fmt: skip
    if site is not None:
        return RunsOn(kind="container", detail=f"an engine container of {site.image} on network {site.network} "
                      f"({'sharing' if site.shares_cache else 'with its own model cache, not'} the gateway's /cache)")
    gpus = plan.env.get("CUDA_VISIBLE_DEVICES") if plan.accelerator == "gpu" else None
    on_gpus = f", GPU {gpus} (CUDA_VISIBLE_DEVICES)" if gpus else ""
    return RunsOn(kind="local", detail=f"a child process of the gateway on a loopback port{on_gpus}")


def unconfigured_line(plan: ModelPlan) -> str:
    """A model served by its Hub id or folder: what was inferred and planned, since no YAML says it."""
    model = plan.model
    decided = ", ".join(f"{d.key}={d.value}" for d in (plan.fit.decisions if plan.fit else []) if d.source == "planner")
    family = next((n.removeprefix("family: ") for n in plan.notes if n.startswith("family: ")), "unknown")
    return (f"{UNCONFIGURED} {model.api_name} served as {model.api_name!r}; family {family}; planned for this "
            f"machine: {decided or 'the defaults'}; make it switchable: `vstack models add "
            f"{model.source.hub or model.source.path}`")
