"""What a started gateway keeps off its request path (adr/0031): LiteLLM is imported only once a cloud deployment
exists, and the server process freezes what it built at start out of the garbage collector's passes.

The upstream is bench/harness/mock_upstream.py (the stand-in for a cloud provider: the one fake the project allows).
"""

from __future__ import annotations

import asyncio
import gc
import threading

import openai
from fastapi import FastAPI

from bench.harness.waiting import free_port
from stack.config.sections.gateway import CloudDeployment, GatewayConfig
from stack.gateway.http import gc_freeze
from stack.gateway.http.admin_routes import cloud_deployment
from stack.gateway.http.serve import GatewayServer, uvicorn_config

from .conftest import cloud_entry, local, run_gateway


def _importing() -> bool:
    return any(t.name == "litellm-import" for t in threading.enumerate())


def test_local_engines_only_never_import_litellm_until_a_cloud_deployment_is_added(cloud_mock) -> None:
    with run_gateway(GatewayConfig(), default_model="m", deployments=[local("engine", cloud_mock.url, "m")]) as gw:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="none")
        chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                     stream=True, max_tokens=3))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "tok tok tok "
        cloud = gw.state.dispatcher.cloud
        assert not cloud._preloading and not _importing()
        gw.state.registry.add(cloud_deployment(CloudDeployment(**cloud_entry(cloud_mock.url)), "cloud-1"))
        assert cloud._preloading  # an /admin cloud deployment: LiteLLM is imported now, on its thread


def test_a_configured_cloud_deployment_imports_litellm_at_start(cloud_mock) -> None:
    settings = GatewayConfig(cloud=[cloud_entry(cloud_mock.url)])
    with run_gateway(settings, default_model="cloud-small") as gw:
        assert gw.state.dispatcher.cloud._preloading


def test_the_server_freezes_what_it_built_once_the_app_started() -> None:
    server = GatewayServer(uvicorn_config(FastAPI(), "127.0.0.1", free_port(), 1))
    gc.unfreeze()
    try:
        asyncio.run(_start_and_stop(server))
        assert gc.get_freeze_count() > 10_000
        before = gc.get_freeze_count()
        made_later = [[i] for i in range(1000)]  # what a late import (LiteLLM's) makes joins them
        gc_freeze.refreeze()
        assert gc.get_freeze_count() >= before + len(made_later)
    finally:
        gc.unfreeze()
        gc_freeze._frozen = False


async def _start_and_stop(server: GatewayServer) -> None:
    server.config.load()
    server.lifespan = server.config.lifespan_class(server.config)
    await server.startup()
    await server.shutdown()
