"""create_app(): the gateway as a FastAPI app, everything it needs passed in (tests build their own)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stack.config.sections.gateway import GatewayConfig
from stack.errors import ConfigError
from stack.gateway import adapter_routes, admin_routes, agent_routes, openai_routes, ops_routes
from stack.gateway.aborts import AbortOnDisconnect
from stack.gateway.adapters import AdapterBook
from stack.gateway.admin_routes import cloud_deployment
from stack.gateway.auth import KeyRing
from stack.gateway.cloud import CloudUpstream
from stack.gateway.console.routes import install as install_console
from stack.gateway.console.sources import ConsoleSources
from stack.gateway.dispatch import Dispatcher
from stack.gateway.docs_routes import docs_router
from stack.gateway.errors import envelope, install_error_handlers
from stack.gateway.local import LocalUpstream
from stack.gateway.metrics import GatewayMetrics
from stack.gateway.providers import KeyPolicy
from stack.gateway.registry import Deployment, DeploymentRegistry
from stack.gateway.request_log import RequestLog
from stack.gateway.routing import Routing
from stack.gateway.runtime_replay import replay
from stack.gateway.runtime_state import RuntimeState
from stack.gateway.state import GatewayState
from stack.manager.manager import ModelManager

log = logging.getLogger("stack.gateway")
Hook = Callable[[GatewayState], Awaitable[None]]


class BodyLimit:
    """413 in OpenAI's shape for bodies over the limit, by Content-Length or while reading chunked ones."""

    def __init__(self, app: ASGIApp, limit: int, metrics: GatewayMetrics | None = None) -> None:
        self.app, self.limit, self.metrics = app, limit, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope["headers"]:
            if name == b"content-length" and (not value.isdigit() or int(value) > self.limit):
                return await self._reject(send)
        if any(name == b"content-length" for name, _ in scope["headers"]):
            return await self.app(scope, receive, send)
        # Chunked upload (no Content-Length): read it here, up to the limit, then replay it.
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, receive, send)
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.limit:
                return await self._reject(send)
            if not message.get("more_body"):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)

    async def _reject(self, send: Send) -> None:
        if self.metrics is not None:
            self.metrics.rejected.labels("413", "request_too_large").inc()
        body = orjson.dumps(
            envelope(
                f"Request body too large: the limit is {self.limit} bytes.",
                "invalid_request_error",
                None,
                "request_too_large",
            )
        )
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


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
) -> FastAPI:
    """default_model: the model group `default` (and /ready) refers to; registry: deployments known
    so far (engines register theirs as they become ready); hooks: start and stop engines; manager: the
    model manager that admits requests to the engines it switches (stack.gateway.engines builds it);
    state_file: where deployments and adapters added through /admin are kept across restarts (none: not kept);
    console: what the console's Plan & config page shows (stack.gateway.console.sources)."""
    registry = registry or DeploymentRegistry()
    keys = KeyRing.from_refs(settings.api_keys, environ)
    admin_keys = KeyRing.from_refs([settings.admin_key] if settings.admin_key else [], environ)
    shared = admin_keys.shared_with(keys)
    if shared:  # their values are equal although the config names them apart: every client would open /admin
        admin, client = shared[0]
        raise ConfigError(f"gateway.admin_key {admin!r} has the same value as gateway.api_keys {client!r}: a client "
                          "key would open /admin", hint="give the admin key a value of its own")
    for i, c in enumerate(settings.cloud):
        registry.add(cloud_deployment(c, f"cloud-{c.model_name}-{i + 1}"))
    routing = Routing(settings, registry, default_model)
    metrics = GatewayMetrics()
    if manager is not None:
        metrics.include(manager.metrics.registry)
    local = LocalUpstream(settings.connect_timeout_s, settings.request_timeout_s)
    dispatcher = Dispatcher(settings, routing, metrics, local, CloudUpstream(settings.request_timeout_s), manager)
    dispatcher.adapters = AdapterBook(registry, metrics.registry)

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
        metrics_keys=KeyRing.union(KeyRing.from_refs([settings.metrics_key] if settings.metrics_key else [], environ),
                                   keys, admin_keys),
        manager=manager,
        key_policy=KeyPolicy(settings.cloud, settings.provider_key_envs),
        adapters=dispatcher.adapters,
        runtime=RuntimeState(state_file),
    )

    on_shutdown = list(on_shutdown or [])

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # LiteLLM's imports (~3 s) on a thread: the gateway serves local engines meanwhile.
        threading.Thread(target=Routing.preload, name="litellm-import", daemon=True).start()
        await local.start()
        for hook in on_startup or []:
            await hook(state)
        await replay(state)  # the /admin changes of the last run, once the engines (and adapter bases) are known
        live = dispatcher.liveness
        watch = asyncio.create_task(live.run(), name="engine liveness") if settings.liveness.enabled else None
        spill = dispatcher.spill
        loads = (asyncio.create_task(spill.book.run(lambda: spill.watched(registry.all())), name="engine loads")
                 if settings.spill.enabled else None)  # fmt: skip
        try:
            yield
        finally:
            for task in (watch, loads):
                if task is not None:
                    task.cancel()
            await spill.book.close()
            for hook in on_shutdown:
                await hook(state)
            await live.close()
            await local.close()
            await state.adapters.close()

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
    app.include_router(agent_routes.router)
    app.include_router(adapter_routes.router)
    # last: OpenAI's 404 JSON for every path no route serves, behind the /v1 keys (its text lists endpoints)
    app.include_router(agent_routes.unknown, dependencies=[Depends(openai_routes.client_key)])
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
    if settings.log_requests:
        app.add_middleware(RequestLog)  # outermost: sees every answer, 413s included
    return app
