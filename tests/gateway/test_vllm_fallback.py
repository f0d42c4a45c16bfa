"""Runs last among the vLLM tests (it kills the shared engine): the fallback answers, then a clean 503.
The cloud provider is a local OpenAI-compatible stand-in (bench/harness/mock_upstream.py), reached through LiteLLM."""

from __future__ import annotations

import httpx
import openai
import pytest

from stack.config.sections.gateway import GatewayConfig

from .conftest import SERVED, cloud_entry, local, run_gateway, stop

pytestmark = pytest.mark.e2e
ASK = [{"role": "user", "content": "What is the capital of France?"}]


def test_engine_killed_fallback_serves_then_503_without_one(vllm_engine, cloud_mock, monkeypatch) -> None:
    monkeypatch.setenv("VSTACK_TEST_CLOUD_KEY", "sk-test-cloud-key-123456")
    settings = GatewayConfig(cloud=[cloud_entry(cloud_mock.url)], fallbacks={SERVED: ["cloud-small"]})
    with run_gateway(settings, default_model=SERVED, deployments=[local("engine", vllm_engine.url)]) as gw:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="none", max_retries=0, timeout=120)
        first = client.chat.completions.with_raw_response.create(model=SERVED, messages=ASK, max_tokens=5)
        assert first.headers["x-vstack-deployment"] == "engine"
        stop(vllm_engine.proc)  # the engine dies
        for stream in (False, True, False):
            raw = client.chat.completions.with_raw_response.create(model=SERVED, messages=ASK, max_tokens=5,
                                                                   stream=stream)  # fmt: skip
            assert raw.status_code == 200
            assert raw.headers["x-vstack-deployment"].startswith("cloud-")
    with run_gateway(GatewayConfig(), default_model=SERVED, deployments=[local("engine", vllm_engine.url)]) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": SERVED, "messages": ASK})
        assert r.status_code == 503 and r.headers["retry-after"]
        assert r.json()["error"]["type"] == "server_error"
