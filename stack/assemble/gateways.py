"""The gateway built around a plan's engines, and served until SIGTERM; or a gateway in front of servers already
running (`python -m stack.entrypoints.gateway`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from stack.assemble.planning import Launch
from stack.assemble.reloader import Reloader
from stack.assemble.runtimes import attached_supervisor, shutdown_hooks, start_early, supervisor
from stack.config.schema import StackConfig
from stack.config.sections.gateway import GatewayConfig, resolve_workers
from stack.config.sections.manager import ManagerConfig
from stack.engine.runtime import logs_of
from stack.errors import EngineError
from stack.planner.plans import ModelPlan, StackPlan
from stack.tracing.settings import Tracing
from stack.tracing.settings import resolve as resolve_tracing

if TYPE_CHECKING:  # the gateway's modules (FastAPI, LiteLLM: seconds) load only once the engine has started
    import uvicorn
    from fastapi import FastAPI

    from stack.gateway.console.sources import ConsoleSources
    from stack.gateway.engines import EngineSupervisor
    from stack.gateway.http.route_context import GatewayState


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
            "summary": fit.summary(),
            "decisions": [{"key": d.key, "value": d.value if isinstance(d.value, int | float | bool | str)
                           else str(d.value), "source": d.source, "reason": d.reason}
                          for d in fit.decisions]}  # fmt: skip


def serve(
    launch: Launch,
    port: int,
    reload_from: tuple[str | None, str | None] | None = None,
    console: ConsoleSources | None = None,
) -> int:
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

    app, sup = build_gateway(
        launch,
        on_startup=[watch_start],
        reload_from=reload_from,
        console=console,
        admin_token_file=token_path(launch.cfg.state_dir),
    )
    app.state.gateway.watch_log(log_handler)
    cfg = launch.cfg
    workers = resolve_workers(cfg.gateway.workers)
    if workers > 1:  # N processes on the port, this one the owner behind them (adr/0049)
        from stack.gateway.workers.pool import owner_server

        logging.getLogger("stack.gateway").info("gateway: %d worker processes on port %d",
                                                                workers, port)  # fmt: skip
        server = owner_server(app, cfg.gateway, cfg.gateway.host, port, workers, "info")
    else:
        server = GatewayServer(
            uvicorn_config(app, cfg.gateway.host, port, cfg.gateway.drain_grace_s, "info", limits=cfg.gateway)
        )
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

    if (
        not is_loopback(cfg.gateway.host)
        and not KeyRing.from_refs(cfg.gateway.api_keys).enabled
        and not cfg.gateway.tenants
    ):
        logging.getLogger("stack.gateway").warning(
            "listening on %s without API keys: anyone who can reach it can use the models; set VSTACK_API_KEY",
            cfg.gateway.host,
        )


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
        return create_app(
            settings,
            default_model=default,
            on_startup=[sup.start],
            on_shutdown=[sup.stop],
            manager=sup.manager,
            state_file=state_file,
            admin_token_file=admin_token_file,
            tracing=tracing,
        )
    registry = DeploymentRegistry()
    for i, (model, url, served) in enumerate(upstreams):
        registry.add(Deployment(id=f"local-{i + 1}", model_group=model, kind="local", upstream_model=served,
                                api_base=url))  # fmt: skip
    return create_app(
        settings,
        default_model=default,
        registry=registry,
        state_file=state_file,
        admin_token_file=admin_token_file,
        tracing=tracing,
    )
