"""Mounting the console on the gateway's app: its pages (console.pages), its JSON calls (console.api), its
static files, and the `Console` that feeds open pages (console.feeds)."""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from stack.gateway.console import api, pages
from stack.gateway.console.feeds import Console
from stack.gateway.console.sources import ConsoleSources
from stack.gateway.http.admin_routes import models_view
from stack.gateway.http.route_context import GatewayState


def install(app: FastAPI, state: GatewayState, sources: ConsoleSources | None = None) -> Console:
    """Mount /ui on `app`; the returned console's `close` goes among the app's shutdown hooks."""
    console = Console(state, sources or ConsoleSources())
    app.state.console = console
    logging.getLogger().addHandler(console.gateway_log)  # the gateway's records (stack.*), wherever they go
    logging.getLogger("uvicorn.error").addHandler(console.gateway_log)  # uvicorn's own does not propagate
    hub = console.hub  # built only when a page listens for it: no page, no cost
    if state.manager is not None:
        state.manager.subscribe(lambda *_: hub.wants("models") and hub.publish("models", models_view(state)))
    app.include_router(pages.router)
    app.include_router(api.router)
    app.mount("/ui/static", StaticFiles(directory=pages.HERE / "static"), name="console-static")
    return console
