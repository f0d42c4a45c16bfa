"""Run a gateway app on uvicorn: uvloop + httptools, no access log, SIGTERM drains in-flight streams.

On SIGTERM/SIGINT uvicorn stops accepting, lets open requests (streams included) finish for up to
`drain_grace_s`, then runs the app's shutdown hooks (which stop the engines).
"""

from __future__ import annotations

import logging

import uvicorn
from fastapi import FastAPI


def uvicorn_config(
    app: FastAPI, host: str, port: int, drain_grace_s: float, log_level: str = "warning"
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level=log_level,
        timeout_graceful_shutdown=int(drain_grace_s) or None,
        # Clients keep connections open between requests; the default 5 s makes them reconnect.
        timeout_keep_alive=30,
    )


def run(app: FastAPI, host: str, port: int, drain_grace_s: float, log_level: str = "warning") -> None:
    logging.getLogger("stack.gateway").setLevel(logging.INFO)
    uvicorn.Server(uvicorn_config(app, host, port, drain_grace_s, log_level)).run()
