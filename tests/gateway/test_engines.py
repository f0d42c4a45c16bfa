"""The gateway starts, registers, watches and stops its engines (stack.engine.process.EngineProcess).
The engine process here is the mock OpenAI server, so this runs in seconds; test_vllm_* use real vLLM."""

from __future__ import annotations

import asyncio
import sys

import httpx
import pytest

from bench.harness.waiting import free_port, wait_for
from stack.assemble.runtimes import engine_supervisor
from stack.config.sections.gateway import GatewayConfig
from stack.engine.process import EngineProcess, EngineSpec
from stack.gateway.engines import ManagedEngine

from .conftest import ROOT, run_gateway


def mock_engine(tmp_path, argv_tail=()) -> EngineProcess:
    port = free_port()
    argv = [sys.executable, str(ROOT / "bench/harness/mock_upstream.py"), "--port", str(port), *argv_tail]
    spec = EngineSpec(name="smol", profile="test", argv=argv, env={}, host="127.0.0.1", port=port,
                      log_path=tmp_path / "engine.log", display_argv=argv)  # fmt: skip
    return EngineProcess(spec)


def test_engine_lifecycle_through_the_gateway(tmp_path) -> None:
    engine = mock_engine(tmp_path)
    sup = engine_supervisor([ManagedEngine(engine, "smol", "smol")], startup_timeout_s=30, stop_grace_s=5)
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}]}
    with run_gateway(GatewayConfig(), default_model="smol", manager=sup.manager) as gw:
        asyncio.run_coroutine_threadsafe(sup.start(gw.state), gw.loop).result(10)
        wait_for(lambda: httpx.get(f"{gw.url}/ready").status_code == 200)
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.headers["x-vstack-deployment"] == "engine-smol"
        engine.popen.kill()  # the engine dies: it leaves the Router, requests get 503 (no fallback set)
        wait_for(lambda: httpx.get(f"{gw.url}/admin/models").json()["models"][0]["state"] == "unavailable")
        assert httpx.post(f"{gw.url}/v1/chat/completions", json=body).status_code == 503
        asyncio.run_coroutine_threadsafe(sup.stop(gw.state), gw.loop).result(30)
    assert engine.exit_code() is not None


def test_engine_that_cannot_start_is_marked_failed(tmp_path) -> None:
    engine = mock_engine(tmp_path, ["--no-such-flag"])
    sup = engine_supervisor([ManagedEngine(engine, "smol", "smol")], startup_timeout_s=30, stop_grace_s=5)
    with run_gateway(GatewayConfig(), default_model="smol", manager=sup.manager) as gw:
        asyncio.run_coroutine_threadsafe(sup.start(gw.state), gw.loop).result(10)
        wait_for(lambda: gw.state.registry.get("engine-smol").state == "failed")
        assert "exited with code" in gw.state.registry.get("engine-smol").detail
        asyncio.run_coroutine_threadsafe(sup.stop(gw.state), gw.loop).result(30)


pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
