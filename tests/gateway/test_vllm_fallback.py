"""The engine dies under the gateway: the fallback answers, then a clean 503. The gateway reaches the run's shared
engine through a byte proxy (bench/harness/byte_proxy.py) of this test's own, and the proxy is what dies: to the
gateway its engine's port closes, as when vLLM exits, while the other tests keep their engine.
The cloud provider is a local OpenAI-compatible stand-in (bench/harness/mock_upstream.py), reached through LiteLLM."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx
import openai
import pytest

from bench.harness.waiting import free_port, wait_http
from stack.config.sections.gateway import GatewayConfig

from .conftest import ROOT, SERVED, cloud_entry, local, run_gateway, stop

pytestmark = pytest.mark.e2e
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def engine_port(vllm_engine) -> Iterator[tuple[subprocess.Popen, str]]:
    """A byte proxy to the shared engine: (its process, its URL)."""
    port = free_port()
    target = vllm_engine.url.removeprefix("http://")
    proc = subprocess.Popen([sys.executable, "bench/harness/byte_proxy.py", "--port", str(port), "--target", target],
                            cwd=ROOT, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", 30, proc)
        yield proc, url
    finally:
        stop(proc)


def test_engine_killed_fallback_serves_then_503_without_one(engine_port, cloud_mock, monkeypatch) -> None:
    monkeypatch.setenv("VSTACK_TEST_CLOUD_KEY", "sk-test-cloud-key-123456")
    proxy, engine_url = engine_port
    settings = GatewayConfig(cloud=[cloud_entry(cloud_mock.url)], fallbacks={SERVED: ["cloud-small"]})
    with run_gateway(settings, default_model=SERVED, deployments=[local("engine", engine_url)]) as gw:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="none", max_retries=0, timeout=120)
        first = client.chat.completions.with_raw_response.create(model=SERVED, messages=ASK, max_tokens=5)
        assert first.headers["x-vstack-deployment"] == "engine"
        stop(proxy)  # the engine dies: its port closes
        for stream in (False, True, False):
            raw = client.chat.completions.with_raw_response.create(model=SERVED, messages=ASK, max_tokens=5,
                                                                   stream=stream)  # fmt: skip
            assert raw.status_code == 200
            assert raw.headers["x-vstack-deployment"].startswith("cloud-")
    with run_gateway(GatewayConfig(), default_model=SERVED, deployments=[local("engine", engine_url)]) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": SERVED, "messages": ASK})
        assert r.status_code == 503 and r.headers["retry-after"]
        assert r.json()["error"]["type"] == "server_error"
