"""Run a gateway app on uvicorn: uvloop + httptools, no access log, SIGTERM drains in-flight streams.

On SIGTERM/SIGINT uvicorn stops accepting, lets open requests (streams included) finish for up to
`drain_grace_s`, then runs the app's shutdown hooks (which stop the engines). Once the app has started, what it
built is frozen out of the garbage collector's passes (stack.gateway.http.gc_freeze).
"""

from __future__ import annotations

import logging

import uvicorn
from fastapi import FastAPI

from stack.config.sections.gateway import GatewayConfig
from stack.gateway.http import gc_freeze
from stack.gateway.http.slow_clients import guarded_protocol


def uvicorn_config(
    app: FastAPI, host: str, port: int, drain_grace_s: float, log_level: str = "warning",
    limits: GatewayConfig | None = None, uds: str | None = None,
) -> uvicorn.Config:
    """limits: the gateway's connection deadlines (header, body, keep-alive); its defaults when None. uds: a
    unix socket to serve instead of host:port (the owner behind its workers: stack.gateway.workers.pool)."""
    limits = limits or GatewayConfig()
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        uds=uds,
        loop="uvloop",
        # httptools with per-connection header and body deadlines (stack.gateway.http.slow_clients).
        http=guarded_protocol(limits.header_timeout_s, limits.body_timeout_s),
        access_log=False,
        log_level=log_level,
        timeout_graceful_shutdown=int(drain_grace_s) or None,
        # Clients keep connections open between requests; the default 5 s makes them reconnect.
        timeout_keep_alive=max(1, round(limits.keep_alive_s)),
        # uvicorn believes X-Forwarded-For/-Proto from 127.0.0.1 by default: any local process could then name
        # the request log's client. Only the proxies gateway.trusted_proxies lists are believed (adr/0039).
        proxy_headers=bool(limits.trusted_proxies),
        forwarded_allow_ips=",".join(limits.trusted_proxies) or None,
    )


class GatewayServer(uvicorn.Server):
    """uvicorn's server that freezes the started app out of the garbage collector (every gateway process)."""

    async def startup(self, sockets: list | None = None) -> None:
        await super().startup(sockets)  # the app's lifespan has started (engines registered) and it listens
        gc_freeze.freeze()


def run(app: FastAPI, host: str, port: int, drain_grace_s: float, log_level: str = "warning",
        limits: GatewayConfig | None = None) -> None:  # fmt: skip
    logging.getLogger("stack.gateway").setLevel(logging.INFO)
    GatewayServer(uvicorn_config(app, host, port, drain_grace_s, log_level, limits)).run()
