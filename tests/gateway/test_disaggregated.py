"""Prefill/decode disaggregation through the gateway (adr/0052), on stand-in engines (bench/harness/mock_upstream.py
answers a prefill request as vLLM's NixlConnector prefill engine does, and lists what it received): the prefill body
of vLLM's proxy flow, the decode body carrying the prefill's kv_transfer_params, one X-Request-Id for both, the
client served by the decode engine and counted once, and what the client hears when a prefill engine fails."""

from __future__ import annotations

import logging

import httpx
import openai
import pytest

from bench.harness.waiting import wait_for
from stack.config.sections.gateway import GatewayConfig
from stack.gateway.registry import Deployment
from stack.gateway.routing.disaggregated import PREFILL_PARAMS

from .conftest import run_gateway, start_mock, stop

MSG = [{"role": "user", "content": "a long prompt"}]


@pytest.fixture(scope="module")
def mocks(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("pd")
    servers = {
        "prefill": start_mock(tmp, "prefill-a", "--chunks", "5"),
        "failing": start_mock(tmp, "prefill-bad", "--kv-transfer", "status-503"),
        "refusing": start_mock(tmp, "prefill-strict", "--kv-transfer", "status-400"),
        "plain": start_mock(tmp, "prefill-plain", "--kv-transfer", "omit"),
        "decode": start_mock(tmp, "decode-a", "--chunks", "5"),
    }
    yield {k: s.url for k, s in servers.items()}
    for s in servers.values():
        stop(s.proc)


def engine(i: int, url: str, phase: str, state: str = "ready") -> Deployment:
    return Deployment(id=f"engine-m-r{i}", model_group="m", kind="local", upstream_model="m", api_base=url,
                      state=state, labels={"replica": str(i), "node": "n", "phase": phase})  # fmt: skip


def last(url: str) -> dict:
    return httpx.get(f"{url}/received", timeout=10).json()[-1]


def test_a_streamed_chat_is_prefilled_then_streamed_by_the_decode_engine_under_one_request_id(mocks) -> None:
    deps = [engine(0, mocks["prefill"], "prefill"), engine(1, mocks["decode"], "decode")]
    with run_gateway(GatewayConfig(), default_model="m", deployments=deps) as gw:
        with httpx.stream("POST", f"{gw.url}/v1/chat/completions", timeout=30,
                          json={"model": "m", "messages": MSG, "stream": True, "max_tokens": 3, "min_tokens": 2,
                                "stream_options": {"include_usage": False}}) as resp:  # fmt: skip
            text = resp.read().decode()
        assert resp.status_code == 200
        assert (resp.headers["x-vstack-deployment"], resp.headers["x-vstack-prefill"]) == ("engine-m-r1", "engine-m-r0")
        assert text.count('"content":"tok "') == 3 and text.endswith("data: [DONE]\n\n")  # the decode engine's stream
        prefill, decode = last(mocks["prefill"]), last(mocks["decode"])
        assert prefill["path"] == decode["path"] == "/v1/chat/completions"
        assert prefill["body"] == {"model": "m", "messages": MSG, "stream": False, "max_tokens": 1,
                                   "kv_transfer_params": PREFILL_PARAMS}  # fmt: skip
        assert decode["body"]["kv_transfer_params"] == {"do_remote_prefill": True, "do_remote_decode": False,
                                                        "remote_engine_id": "prefill-a", "remote_block_ids": [1, 2],
                                                        "remote_host": "127.0.0.1", "remote_port": 5600}  # fmt: skip
        assert (decode["body"]["stream"], decode["body"]["max_tokens"], decode["body"]["min_tokens"]) == (True, 3, 2)
        assert prefill["request_id"] and prefill["request_id"] == decode["request_id"]
        # Counted once, on the decode engine: its request and its 3 tokens; the prefill's one token nowhere.
        done = 'vstack_gateway_requests_total{deployment="engine-m-r1",model="m",status="200"} 1.0'
        wait_for(lambda: done in httpx.get(f"{gw.url}/metrics").text, 10, "the request counted")
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert 'deployment="engine-m-r0"' not in metrics.split("vstack_gateway_upstream_errors")[0]
        assert 'vstack_gateway_tokens_total{deployment="engine-m-r1",direction="completion",model="m"} 3.0' in metrics
        assert gw.state.routing.replicas.outstanding == {"engine-m-r0": 0, "engine-m-r1": 0}


def test_completions_whole_answers_and_max_completion_tokens_follow_the_same_flow(mocks) -> None:
    deps = [engine(0, mocks["prefill"], "prefill"), engine(1, mocks["decode"], "decode")]
    with run_gateway(GatewayConfig(), default_model="m", deployments=deps) as gw:
        c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
        out = c.completions.create(model="m", prompt="Once upon a time", max_tokens=4)
        assert out.choices[0].text == "tok " * 4 and out.usage.completion_tokens == 4
        prefill, decode = last(mocks["prefill"]), last(mocks["decode"])
        assert prefill["path"] == "/v1/completions" and prefill["body"]["max_tokens"] == 1
        assert prefill["body"]["stream"] is False and decode["body"]["kv_transfer_params"]["remote_engine_id"]
        assert prefill["request_id"] == decode["request_id"]
        c.chat.completions.create(model="m", messages=MSG, max_completion_tokens=4)
        prefill, decode = last(mocks["prefill"]), last(mocks["decode"])
        assert (prefill["body"]["max_completion_tokens"], decode["body"]["max_completion_tokens"]) == (1, 4)


def test_a_failing_prefill_engine_is_passed_over_then_named_to_the_client(mocks) -> None:
    deps = [engine(0, mocks["failing"], "prefill"), engine(1, mocks["prefill"], "prefill"),
            engine(2, mocks["decode"], "decode")]  # fmt: skip
    with run_gateway(GatewayConfig(), default_model="m", deployments=deps) as gw:
        body = {"model": "m", "messages": MSG, "max_tokens": 2}
        ok = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=30)
        assert ok.status_code == 200 and ok.headers["x-vstack-prefill"] == "engine-m-r1"
        assert (
            'vstack_gateway_upstream_errors_total{deployment="engine-m-r0",reason="error"} 1.0'
            in httpx.get(f"{gw.url}/metrics").text
        )
    served = len(httpx.get(f"{mocks['decode']}/received").json())
    alone = [engine(0, mocks["failing"], "prefill"), engine(2, mocks["decode"], "decode")]
    with run_gateway(GatewayConfig(), default_model="m", deployments=alone) as gw:
        bad = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=30)
    assert bad.status_code == 502
    assert bad.json()["error"]["message"] == (
        "prefill engine engine-m-r0 failed (engine-m-r0 answered 503); the request was not sent to a decode "
        "engine; tried: engine-m-r0"
    )
    assert len(httpx.get(f"{mocks['decode']}/received").json()) == served  # the decode engine never saw it


def test_a_prefill_engines_refusal_reaches_the_client_as_its_own(mocks) -> None:
    deps = [engine(0, mocks["refusing"], "prefill"), engine(1, mocks["decode"], "decode")]
    with run_gateway(GatewayConfig(), default_model="m", deployments=deps) as gw:
        resp = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": MSG}, timeout=30)
    assert resp.status_code == 400 and resp.json()["error"]["message"] == "prefill-strict failed the prefill"


def test_without_kv_transfer_params_or_a_ready_prefill_engine_the_decode_engine_serves_it_whole(
    mocks, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"model": "m", "messages": MSG, "max_tokens": 2}
    deps = [engine(0, mocks["plain"], "prefill"), engine(1, mocks["decode"], "decode")]
    with caplog.at_level(logging.WARNING, "stack.gateway.disaggregated"):
        with run_gateway(GatewayConfig(), default_model="m", deployments=deps) as gw:
            resp = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=30)
        assert resp.status_code == 200
        assert resp.headers["x-vstack-prefill"] == "engine-m-r0 (no kv_transfer_params: decoded whole)"
        assert "kv_transfer_params" not in last(mocks["decode"])["body"]
        assert (
            "prefill engine engine-m-r0 answered request" in caplog.text and "without kv_transfer_params" in caplog.text
        )
        lost = [engine(0, mocks["prefill"], "prefill", state="failed"), engine(1, mocks["decode"], "decode")]
        with run_gateway(GatewayConfig(), default_model="m", deployments=lost) as gw:
            resp = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=30)
        assert resp.status_code == 200 and resp.headers["x-vstack-prefill"] == "none ready"
        assert resp.headers["x-vstack-deployment"] == "engine-m-r1" and "no prefill engine of m is ready" in caplog.text


def test_each_ray_replicas_phase_becomes_its_deployments_label() -> None:
    from types import SimpleNamespace

    from stack.gateway.engines import sync_replicas
    from stack.gateway.registry import DeploymentRegistry
    from stack.manager.states import ModelState

    registry = DeploymentRegistry()
    registry.add(Deployment(id="engine-m", model_group="m", kind="local", upstream_model="m", labels={"role": "set"}))
    replicas = [{"replica": i, "state": "ready", "detail": "", "url": f"http://127.0.0.1:{9000 + i}", "node": "n",
                 "phase": phase} for i, phase in enumerate(("prefill", "decode"))]  # fmt: skip
    sync_replicas(registry, "engine-m", SimpleNamespace(state=ModelState.READY), replicas)  # type: ignore[arg-type]
    assert {d.id: d.labels.get("phase") for d in registry.ready("m")} == {"engine-m-r0": "prefill",
                                                                          "engine-m-r1": "decode"}  # fmt: skip
