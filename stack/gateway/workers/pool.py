"""The owner's side of a gateway with workers (gateway.workers > 1; adr/0049): it holds the public port, N
worker processes listen on it (SO_REUSEPORT: the kernel spreads the connections evenly), and it serves its whole
app on a unix socket only the workers reach, restoring each request's client address from the worker's
`x-vstack-peer` header. The workers start once the app has started (the engines registered, as the port opened
before), get SIGTERM with the owner (they drain their streams), and are joined
before the app's own shutdown stops the engines."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from stack.config.sections.gateway import GatewayConfig
from stack.gateway.http.route_context import GatewayState
from stack.gateway.http.serve import GatewayServer, uvicorn_config
from stack.gateway.workers.desk import WorkerDesk
from stack.gateway.workers.worker import bind, run_worker


class WorkerPool:
    def __init__(self, count: int, settings: GatewayConfig, host: str, port: int, log_level: str) -> None:
        self.count, self.settings, self.log_level = count, settings.model_copy(update={"host": host}), log_level
        self.sock = bind(host, port, listen=False)
        self.host = host
        self.run_dir = Path(tempfile.mkdtemp(prefix="vstack-gateway-"))  # 0700: the owner's user only
        self.desk_path, self.http_path = self.run_dir / "desk.sock", self.run_dir / "owner.sock"
        self.procs: list[Any] = []
        self.desk: WorkerDesk | None = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    async def start(self, state: GatewayState) -> None:
        self.desk = WorkerDesk(state)
        await self.desk.start(self.desk_path)
        open_api = not state.keys.enabled and not state.dispatcher.tenants.book.enabled
        spawn = multiprocessing.get_context("spawn")
        settings = self.settings.model_dump_json()
        for i in range(1, self.count + 1):
            paths = (str(self.desk_path), str(self.http_path))
            args = (i, settings, self.host, self.port, *paths, open_api, self.log_level)
            proc = spawn.Process(target=run_worker, name=f"vstack-gateway-worker-{i}", args=args)
            proc.start()
            self.procs.append(proc)

    def signal(self) -> None:
        """SIGTERM to every worker: each stops accepting and lets its streams finish (drain_grace_s)."""
        for proc in self.procs:
            if proc.pid is not None and proc.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)

    async def stop(self) -> None:
        self.signal()
        await asyncio.to_thread(self._join, self.settings.drain_grace_s + 5)
        if self.desk is not None:
            await self.desk.close()
        self.sock.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _join(self, grace: float) -> None:
        for proc in self.procs:
            proc.join(grace)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


class OwnerApp:
    """The app as the owner serves it behind its workers: starts and stops them with its lifespan, and restores
    each request's client address (the workers' `x-vstack-peer`: only they reach the owner's unix socket)."""

    def __init__(self, app: Any, pool: WorkerPool) -> None:
        self.app, self.pool = app, pool
        self.state = app.state  # what the entry points read of the app (its gateway state, its console)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await self._lifespan(scope, receive, send)
        if scope["type"] in ("http", "websocket"):
            headers = scope["headers"]
            for name, value in headers:
                if name == b"x-vstack-peer":
                    host, _, port = value.decode("latin-1").rpartition(":")
                    scope["client"] = (host, int(port)) if port.isdigit() else None
                    scope["headers"] = [h for h in headers if h[0] != b"x-vstack-peer"]
                    break
            else:
                scope["client"] = None  # not through a worker: no address to believe
        await self.app(scope, receive, send)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def received() -> Any:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await self.pool.stop()  # the workers' streams end before the engines stop
            return message

        async def sending(message: Any) -> None:
            if message["type"] == "lifespan.startup.complete":
                await self.pool.start(self.app.state.gateway)
            await send(message)

        await self.app(scope, received, sending)


def owner_server(app: ASGIApp, settings: GatewayConfig, host: str, port: int, workers: int,
                 log_level: str = "warning") -> GatewayServer:  # fmt: skip
    """The owner's uvicorn server (on its unix socket) with `workers` processes on host:port; run it as any."""
    pool = WorkerPool(workers, settings, host, port, log_level)
    owner = OwnerApp(app, pool)
    config = uvicorn_config(owner, host, port, settings.drain_grace_s, log_level, limits=settings,  # type: ignore[arg-type]
                            uds=str(pool.http_path))  # fmt: skip
    server = GatewayServer(config)
    handle_exit = server.handle_exit

    def exiting(sig: int, frame: Any) -> None:
        pool.signal()  # the workers stop accepting at once, as a one-process gateway does
        handle_exit(sig, frame)

    server.handle_exit = exiting  # type: ignore[method-assign]
    server.pool = pool  # type: ignore[attr-defined]
    return server
