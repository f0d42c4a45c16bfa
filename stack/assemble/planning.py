"""From a configuration to a plan (`plan_up`), and the Launch that serves it: the plan with what serving it adds
(the Docker client, the sleep handoff's broker, the default's engine started early)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

from stack.config.schema import StackConfig
from stack.engine.kept import (
    kept_pids,
)
from stack.engine.runtime import Runtime
from stack.hardware import HardwareInfo, detect
from stack.models import pull
from stack.planner.plans import ContainerSite, StackPlan
from stack.planner.stack_planner import plan_stack
from stack.vllm.plugins.handoff import HandoffBroker

if TYPE_CHECKING:  # the gateway's modules (FastAPI, LiteLLM: seconds) load only once the engine has started
    from stack.engine.docker_site import Site
    from stack.engine.early_spawn import EarlyEngine
    from stack.vllm.options import VllmCatalog


Status = Callable[[str], None]


PLAN_SECRETS_ENV = "VSTACK_PLAN_SECRETS"  # an engine container's ModelPlan secrets (stack.entrypoints.engine_container)


def plan_up(
    cfg: StackConfig,
    target: str | None,
    *,
    on_status: Status = print,
    hardware: HardwareInfo | None = None,
    catalog: VllmCatalog | None = None,
    fetch: bool = True,
    overrides: dict | None = None,
) -> StackPlan:
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
    return plan_stack(
        cfg,
        target,
        hardware,
        catalog,
        site=site,
        nodes=nodes,
        on_status=on_status,
        parsers=parsers,
        overrides=overrides,
        fetch=(lambda entry: pull(entry, cfg, on_status)) if fetches else None,
    )


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


def docker_site(cfg: StackConfig) -> ContainerSite | None:
    """manager.runtime: docker: where engine containers go, checked before anything starts."""
    if cfg.manager.runtime != "docker":
        return None
    from stack.config.loader import builtin_config_dir
    from stack.engine.docker_site import connect, discover

    # Its warnings stay with it: the gateway logs them when it serves the plan (build_gateway).
    return describe_site(discover(cfg.manager.docker, connect(), builtin_config_dir(), cfg.cache_dir))


def fetches_models(site: Site | None) -> bool:
    """Engines that are child processes, or containers sharing the gateway's /cache volume, use the files
    the gateway fetched. Engine containers with a cache of their own (a gateway on a host) fetch for
    themselves: a second copy on the host would be dead weight."""
    return site is None or site.shares_cache
