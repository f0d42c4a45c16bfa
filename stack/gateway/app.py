"""create_app(): the gateway as a FastAPI app, everything it needs passed in (tests build their own)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware

from stack.config.sections.gateway import GatewayConfig
from stack.errors import ConfigError
from stack.gateway.console.mount import install as install_console
from stack.gateway.console.sources import ConsoleSources
from stack.gateway.http import (
    adapter_routes,
    admin_routes,
    endpoint_routes,
    gc_freeze,
    key_routes,
    openai_routes,
    ops_routes,
    unknown_routes,
)
from stack.gateway.http.admin_routes import cloud_deployment
from stack.gateway.http.auth import KeyRing
from stack.gateway.http.body_limit import BodyLimit
from stack.gateway.http.client_aborts import AbortOnDisconnect
from stack.gateway.http.cross_site import CrossSiteGuard, HostNames
from stack.gateway.http.docs_routes import docs_router
from stack.gateway.http.error_handlers import install_error_handlers
from stack.gateway.http.openai_fast_path import OpenAIFastPath
from stack.gateway.http.request_log import RequestLog
from stack.gateway.http.route_context import GatewayState
from stack.gateway.http.runtime_replay import replay
from stack.gateway.http.runtime_state import RuntimeState
from stack.gateway.metrics import GatewayMetrics
from stack.gateway.registry import Deployment, DeploymentRegistry
from stack.gateway.routing.adapters import AdapterBook
from stack.gateway.routing.deployment_choice import Routing
from stack.gateway.routing.dispatcher import Dispatcher
from stack.gateway.tenants.gate import Gate
from stack.gateway.upstreams.cloud_client import CloudUpstream
from stack.gateway.upstreams.fast_path import LocalUpstream
from stack.gateway.upstreams.provider_keys import KeyPolicy
from stack.manager import admin_token
from stack.manager.manager import ModelManager
from stack.tracing.settings import Tracing
from stack.tracing.tracer import tracer_for

log = logging.getLogger("stack.gateway")
Hook = Callable[[GatewayState], Awaitable[None]]
USAGE_SAVE_S = 10.0


async def save_usage(tenants: Gate) -> None:
    """The budgets' totals to state_dir/usage.json every few seconds while they change (and at shutdown)."""
    while True:
        await asyncio.sleep(USAGE_SAVE_S)
        await tenants.save_soon()


def create_app(
    settings: GatewayConfig,
    *,
    default_model: str,
    registry: DeploymentRegistry | None = None,
    on_startup: list[Hook] | None = None,
    on_shutdown: list[Hook] | None = None,
    environ: Mapping[str, str] | None = None,
    manager: ModelManager | None = None,
    state_file: Path | None = None,
    console: ConsoleSources | None = None,
    admin_token_file: Path | None = None,
    tracing: Tracing | None = None,
) -> FastAPI:
    """default_model: the model group `default` (and /ready) refers to; registry: deployments known
    so far (engines register theirs as they become ready); hooks: start and stop engines; manager: the
    model manager that admits requests to the engines it switches (stack.gateway.engines builds it);
    state_file: where deployments and adapters added through /admin are kept across restarts (none: not kept);
    console: what the console's Plan & config page shows (stack.gateway.console.sources); admin_token_file:
    without an admin key, where the token /admin/* then needs is written (`vstack up`: state_dir/admin-token;
    none: any local client is admin, for gateways built inside a test or a benchmark); tracing:
    observability.tracing resolved (stack.tracing.settings; None: no spans at all, as tests' apps)."""
    registry = registry or DeploymentRegistry()
    keys = KeyRing.from_refs(settings.api_keys, environ)
    admin_keys = KeyRing.from_refs([settings.admin_key] if settings.admin_key else [], environ)
    shared = admin_keys.shared_with(keys)
    if shared:  # their values are equal although the config names them apart: every client would open /admin
        admin, client = shared[0]
        raise ConfigError(
            f"gateway.admin_key {admin!r} has the same value as gateway.api_keys {client!r}: a client "
            "key would open /admin",
            hint="give the admin key a value of its own",
        )
    for i, c in enumerate(settings.cloud):
        registry.add(cloud_deployment(c, f"cloud-{c.model_name}-{i + 1}"))
    routing = Routing(settings, registry, default_model)
    metrics = GatewayMetrics()
    if manager is not None:
        metrics.include(manager.metrics.registry)
    local = LocalUpstream(settings.connect_timeout_s, settings.request_timeout_s)
    cloud = CloudUpstream(settings.request_timeout_s)
    cloud.after_import = gc_freeze.refreeze  # a server process that froze its start freezes LiteLLM's objects too
    dispatcher = Dispatcher(settings, routing, metrics, local, cloud, manager)
    dispatcher.adapters = AdapterBook(registry, metrics.registry)
    dispatcher.tracer = tracer_for(tracing)
    if manager is not None and dispatcher.tracer is not None:
        manager.tracer = dispatcher.tracer  # switches, starts and sleeps get traces of their own
    tenants = dispatcher.tenants
    tenants.configure(settings.tenants, environ, state_file.with_name("usage.json") if state_file else None)
    if admin_keys.shared_with(KeyRing(tenants.book.digests())) or keys.shared_with(KeyRing(tenants.book.digests())):
        raise ConfigError(
            "a gateway.tenants key has the same value as gateway.admin_key or an api_keys entry",
            hint="give each named key a value of its own (`vstack keys add NAME` draws one)",
        )

    async def restart_engine(dep: Deployment, why: str) -> None:
        # An engine whose base model an adapter changed: the manager starts a fresh one (its own engines only).
        if manager is not None and manager.manages(dep.model_group):
            await manager.restart(dep.model_group, why)

    dispatcher.adapters.on_corrupt = restart_engine
    state = GatewayState(
        settings=settings,
        registry=registry,
        routing=routing,
        metrics=metrics,
        dispatcher=dispatcher,
        keys=keys,
        admin_keys=admin_keys,
        metrics_keys=KeyRing.union(
            KeyRing.from_refs([settings.metrics_key] if settings.metrics_key else [], environ), keys, admin_keys
        ),
        manager=manager,
        key_policy=KeyPolicy(settings.cloud, settings.provider_key_envs),
        adapters=dispatcher.adapters,
        runtime=RuntimeState(state_file),
    )
    if admin_token_file is not None and not admin_keys.enabled:
        try:
            state.admin_token = admin_token.issue(admin_token_file)
        except OSError as exc:  # still required: /admin then needs an admin key, never opens to every client
            state.admin_token = admin_token.secrets.token_urlsafe(32)
            log.error("the admin token could not be written to %s (%s): /admin/* answers no one until "
                      "gateway.admin_key (VSTACK_ADMIN_KEY) is set or the folder is writable",
                      admin_token_file, exc.strerror or exc)  # fmt: skip
        token = state.admin_token

        async def withdraw_token(_state: GatewayState) -> None:
            admin_token.withdraw(admin_token_file, token)

        on_shutdown = [*(on_shutdown or []), withdraw_token]

    on_shutdown = list(on_shutdown or [])

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # LiteLLM's imports (~3 s) on a thread, where a cloud deployment needs it: the gateway serves meanwhile.
        cloud.preload_for(registry.all())
        registry.subscribe(lambda _id, _before, after: cloud.preload_for([after] if after is not None else []))
        await local.start()
        for hook in on_startup or []:
            await hook(state)
        await replay(state)  # the /admin changes of the last run, once the engines (and adapter bases) are known
        saver = asyncio.create_task(save_usage(tenants), name="usage totals")
        live = dispatcher.liveness
        watch = asyncio.create_task(live.run(), name="engine liveness") if settings.liveness.enabled else None
        spill = dispatcher.spill
        loads = (asyncio.create_task(spill.book.run(lambda: spill.watched(registry.all())), name="engine loads")
                 if settings.spill.enabled else None)  # fmt: skip
        try:
            yield
        finally:
            for task in (watch, loads, saver):
                if task is not None:
                    task.cancel()
            await spill.book.close()
            for hook in on_shutdown:
                await hook(state)
            await live.close()
            await routing.replicas.kv.close()
            await local.close()
            await state.adapters.close()
            tenants.save()
            if dispatcher.tracer is not None:
                await asyncio.to_thread(dispatcher.tracer.close)  # the last spans flushed to the collector

    app = FastAPI(
        title="vllm-stack gateway",
        version="1",
        description="OpenAI-compatible endpoint in front of local vLLM engines, with cloud fallbacks.",
        lifespan=lifespan,
        # Served by docs_routes instead, behind the /v1 keys: the schema must not be open when /v1 is not.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.gateway = state
    install_error_handlers(app)
    app.include_router(openai_routes.router)
    app.include_router(admin_routes.router)
    app.include_router(ops_routes.router)
    if settings.docs:
        app.include_router(docs_router(app))
    if settings.console:
        on_shutdown.append(install_console(app, state, console).close)
    app.include_router(endpoint_routes.router)
    app.include_router(adapter_routes.router)
    app.include_router(key_routes.router)
    # last: OpenAI's 404 JSON for every path no route serves, behind the /v1 keys (its text lists endpoints)
    app.include_router(unknown_routes.unknown, dependencies=[Depends(openai_routes.client_key)])
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["authorization", "content-type", "x-api-key"],
            expose_headers=["x-vstack-deployment"],
        )
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, metrics=metrics)
    app.add_middleware(AbortOnDisconnect)  # a client gone mid-request cancels it, so the engine aborts it too
    app.add_middleware(OpenAIFastPath, state=state)  # the plain POSTs of /v1 without the layers above (adr/0032)
    # before the fast path: a page's form post or a rebinding Host never reaches a route (adr/0039)
    names = HostNames(settings.host, settings.allowed_hosts)
    app.add_middleware(CrossSiteGuard, names=names, open_api=not keys.enabled and not tenants.book.enabled)
    if settings.log_requests:
        app.add_middleware(RequestLog)  # outermost: sees every answer, 413s included
    return app
