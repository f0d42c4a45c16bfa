"""OpenTelemetry traces of requests through the gateway (stack.tracing; adr/0042).

The collector is outside this machine in a deployment: bench/harness/otlp_receiver.py stands in for it, a real
OTLP/HTTP receiver decoding the gateway's `ExportTraceServiceRequest`s with opentelemetry-proto. The engines
are the local OpenAI-compatible stand-in (bench/harness/mock_upstream.py), which records the W3C traceparent
of every request it gets; the cloud fallback is the same stand-in reached through LiteLLM's OpenAI provider.
"""

from __future__ import annotations

import httpx
import pytest

from bench.harness.otlp_receiver import otlp_receiver
from bench.harness.waiting import free_port, wait_for
from stack.config.sections.gateway import GatewayConfig
from stack.config.sections.observability import TracingConfig
from stack.tracing.settings import resolve

from .conftest import cloud_entry, local, run_gateway, start_mock, stop

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tracing")
    good, bad = start_mock(tmp, "good", "--chunks", "3"), start_mock(tmp, "bad", "--chunks", "3")
    yield good, bad
    stop(good.proc)
    stop(bad.proc)


@pytest.fixture(scope="module")
def collector():
    with otlp_receiver() as (url, received):
        yield url, received


def seen(url: str) -> list[str]:
    return httpx.get(f"{url}/traceparents", timeout=5).json()


def names(spans) -> list[str]:
    return sorted(s.name for s in spans)


def test_a_streamed_request_is_one_trace_from_the_gateway_to_the_engine(engines, collector) -> None:
    url, received = collector
    good, _ = engines
    tracing = resolve(TracingConfig(endpoint=url, service_name="gw-under-test"), environ={})
    with run_gateway(GatewayConfig(), default_model="m", deployments=[local("engine", good.url, group="m")],
                     tracing=tracing) as gw:  # fmt: skip
        resp = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10)
        assert resp.status_code == 200 and "data: [DONE]" in resp.text
        trace_id = resp.headers["x-vstack-trace-id"]
        assert gw.state.dispatcher.tracer.flush()
        spans = received.wait_for(trace_id, count=4)
        activity = gw.state.dispatcher.activity.last()[0]
        with httpx.Client(base_url=gw.url, timeout=10) as console:
            console.get("/ui/activity")  # a loopback browser without keys: its session
            timeline = console.get(f"/ui/api/trace/{activity['id']}").json()
            missing = console.get("/ui/api/trace/999999")
    assert names(spans) == ["POST /v1/chat/completions", "chat m", "gateway.receive", "gateway.stream"]
    assert {s.trace_id for s in spans} == {trace_id} and {s.service for s in spans} == {"gw-under-test"}
    by = {s.name: s for s in spans}
    root, attempt = by["POST /v1/chat/completions"], by["chat m"]
    assert root.parent_id == "" and attempt.parent_id == root.span_id
    assert by["gateway.stream"].parent_id == attempt.span_id
    # GenAI semantic conventions: what was asked, what answered, the tokens the engine counted
    assert root.attributes["gen_ai.operation.name"] == "chat"
    assert root.attributes["gen_ai.request.model"] == "m" and root.attributes["gen_ai.request.max_tokens"] == 3
    assert root.attributes["gen_ai.usage.input_tokens"] == 5 and root.attributes["gen_ai.usage.output_tokens"] == 3
    assert root.attributes["http.response.status_code"] == 200 and root.attributes["vstack.route"] == "local"
    assert attempt.attributes["gen_ai.system"] == "vllm" and attempt.attributes["gen_ai.response.model"] == "m"
    assert attempt.kind == 3 and "gen_ai.first_token" in attempt.events  # SPAN_KIND_CLIENT
    assert root.start_ns <= attempt.start_ns < attempt.end_ns <= root.end_ns
    # the engine got the attempt's span as its parent: its own spans join this trace
    assert seen(good.url)[-1] == f"00-{trace_id}-{attempt.span_id}-01"
    # the Activity row names the trace the console's waterfall opens: the same spans, on the request's clock
    assert activity["trace_id"] == trace_id == timeline["trace_id"] and timeline["activity_id"] == activity["id"]
    phases = {s["name"]: s for s in timeline["spans"]}
    assert sorted(phases) == names(spans) and phases["POST /v1/chat/completions"]["start_ms"] == 0
    assert phases["chat m"]["events"][0]["name"] == "gen_ai.first_token"
    assert abs(phases["POST /v1/chat/completions"]["duration_ms"] - (root.end_ns - root.start_ns) / 1e6) < 0.01
    assert missing.status_code == 404 and "keeps the last 500" in missing.json()["error"]["message"]


def test_a_retry_and_a_fallback_stay_in_the_clients_trace(engines, collector) -> None:
    url, received = collector
    good, bad = engines
    tracing = resolve(TracingConfig(endpoint=url), environ={})
    deps = [local("bad", bad.url, group="m", upstream="status-503"), local("good", good.url, group="m", order=2)]
    client_trace, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with run_gateway(GatewayConfig(num_retries=1, retry_backoff_s=0.01), default_model="m", deployments=deps,
                     tracing=tracing) as gw:  # fmt: skip
        resp = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, timeout=10,
                          headers={"traceparent": f"00-{client_trace}-{client_span}-01"})  # fmt: skip
        assert resp.status_code == 200, resp.text
        assert gw.state.dispatcher.tracer.flush()
        spans = received.wait_for(client_trace, count=6)
    assert resp.headers["x-vstack-trace-id"] == client_trace
    by_name: dict[str, list] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    tries = sorted(by_name["chat status-503"], key=lambda s: s.start_ns)
    assert len(tries) == 2 and [t.attributes["vstack.retry"] for t in tries] == [False, True]
    assert all(t.attributes["error.type"] == "error" and t.status_code == 2 for t in tries)  # STATUS_CODE_ERROR
    assert len(by_name["gateway.retry_backoff"]) == 1
    (served,) = by_name["chat m"]
    assert served.attributes["vstack.deployment"] == "good" and "error.type" not in served.attributes
    (root,) = by_name["POST /v1/chat/completions"]
    assert root.parent_id == client_span  # the client's span is the gateway's parent
    # every try told its engine which span it was
    assert seen(bad.url)[-2:] == [f"00-{client_trace}-{t.span_id}-01" for t in tries]
    assert seen(good.url)[-1] == f"00-{client_trace}-{served.span_id}-01"


def test_a_model_with_a_ttft_objective_records_its_spill_decision(engines) -> None:
    good, _ = engines
    settings = GatewayConfig(spill={"slo": {"m": "p95_ttft_ms<30000"}, "min_samples": 50})
    with run_gateway(settings, default_model="m", deployments=[local("engine", good.url, group="m")],
                     tracing=resolve(TracingConfig(keep=10), environ={})) as gw:  # fmt: skip
        resp = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, timeout=10)
        assert resp.status_code == 200
        kept = gw.state.dispatcher.tracer.buffer.get(resp.headers["x-vstack-trace-id"])
    decision = next(s for s in kept["spans"] if s["name"] == "gateway.spill_decision")
    assert decision["attributes"]["vstack.spill"] is False
    assert decision["attributes"]["vstack.spill.reason"] == "no_estimate"  # fewer samples than min_samples
    assert "p95_ttft_ms<30000" in decision["attributes"]["vstack.spill.why"]
    assert not kept["sampled"]  # kept for the console only: nothing exported, the engine told not to record


def test_the_agents_apis_are_traced_too(engines) -> None:
    good, _ = engines
    with run_gateway(GatewayConfig(), default_model="m", deployments=[local("engine", good.url, group="m")],
                     tracing=resolve(TracingConfig(keep=10), environ={})) as gw:  # fmt: skip
        resp = httpx.post(f"{gw.url}/v1/responses", json={"model": "m", "input": "hi"}, timeout=10)
        assert resp.status_code == 200, resp.text
        kept = gw.state.dispatcher.tracer.buffer.get(resp.headers["x-vstack-trace-id"])
    assert [s["name"] for s in kept["spans"]] == ["POST /v1/responses", "chat m"]
    assert kept["spans"][0]["attributes"]["http.response.status_code"] == 200


def test_tracing_off_sends_no_traceparent_and_keeps_nothing(engines) -> None:
    good, _ = engines
    with run_gateway(GatewayConfig(), default_model="m", deployments=[local("engine", good.url, group="m")]) as gw:
        resp = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, timeout=10)
        assert resp.status_code == 200
        assert gw.state.dispatcher.tracer is None
    assert "x-vstack-trace-id" not in resp.headers
    assert seen(good.url)[-1] == ""


def test_a_cloud_fallback_through_litellm_carries_the_trace(cloud_mock, collector, monkeypatch) -> None:
    monkeypatch.setenv("VSTACK_TEST_CLOUD_KEY", "sk-test-cloud-key-123456")
    url, received = collector
    dead = f"http://127.0.0.1:{free_port()}"
    settings = GatewayConfig(cloud=[cloud_entry(cloud_mock.url)], fallbacks={"m": ["cloud-small"]})
    with run_gateway(settings, default_model="m", deployments=[local("local-a", dead, "m")],
                     tracing=resolve(TracingConfig(endpoint=url), environ={})) as gw:  # fmt: skip
        resp = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=60)
        assert resp.status_code == 200 and resp.headers["x-vstack-fallback"] == "connect"
        trace_id = resp.headers["x-vstack-trace-id"]
        assert gw.state.dispatcher.tracer.flush()
        spans = received.wait_for(trace_id, count=5)
    by = {s.name: s for s in spans}
    assert by["chat m"].attributes["error.type"] == "connect"  # the dead engine's try, then the provider's
    cloud = by["chat openai/cloud-small"]
    assert cloud.attributes["gen_ai.system"] == "openai" and cloud.attributes["vstack.fallback_reason"] == "connect"
    assert by["POST /v1/chat/completions"].attributes["vstack.route"] == "fallback:connect"
    assert seen(cloud_mock.url)[-1] == f"00-{trace_id}-{cloud.span_id}-01"  # through LiteLLM's extra_headers


def test_a_request_that_waits_for_a_start_names_the_switch_and_its_phases(tmp_path) -> None:
    """The model manager's switch is a trace of its own; the request that waited for it names it in its
    admission span, and the console's timeline shows its phases on the request's clock. The engine is the
    stand-in with vLLM's sleep endpoints (bench/harness/mock_upstream.py), spawned as an engine is."""
    from stack.assemble.runtimes import engine_supervisor
    from stack.config.sections.manager import ManagerConfig
    from stack.gateway.engines import ManagedEngine
    from stack.manager.policy import Capacity
    from tests.manager.conftest import GIB
    from tests.manager.test_kept_asleep import WEIGHTS, engine

    runtime = engine(tmp_path)
    managed = ManagedEngine(runtime, "m", "m", need=GIB, can_sleep=True, weights_gpu=WEIGHTS, weights_host=WEIGHTS)
    sup = engine_supervisor([managed], startup_timeout_s=30, stop_grace_s=5,
                           settings=ManagerConfig(min_residency_s=0, quiet_s=0),
                           capacity=Capacity(100 * GIB, True, 8 * GIB))  # fmt: skip
    with run_gateway(GatewayConfig(), default_model="m", manager=sup.manager,
                     tracing=resolve(TracingConfig(keep=50), environ={})) as gw:  # fmt: skip
        try:
            gw.call(sup.start(gw.state), timeout=30)
            wait_for(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, 30, "the engine ready")
            gw.call(sup.manager.unload("m"), timeout=30)  # stopped: the next request waits for its start
            resp = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, timeout=30)
            assert resp.status_code == 200, resp.text
            with httpx.Client(base_url=gw.url, timeout=10) as console:
                console.get("/ui/activity")
                timeline = console.get(f"/ui/api/trace/{resp.headers['x-vstack-trace-id']}").json()
        finally:
            gw.call(sup.stop(gw.state), timeout=30)
    admission = next(s for s in timeline["spans"] if s["name"] == "gateway.admission")
    assert admission["attributes"]["vstack.switch.kind"] == "cold" and admission["attributes"]["vstack.admitted"]
    assert [s["name"] for s in timeline["switch"]] == ["manager.switch m", "manager.start m", "manager.wait_ready m"]
    first = timeline["switch"][0]
    assert first["attributes"]["vstack.switch.kind"] == "cold"
    assert admission["attributes"]["vstack.switch.trace_id"] != timeline["trace_id"]  # a trace of its own
    # the switch ran while the request waited: placed inside its admission on the request's clock
    assert admission["start_ms"] - 1 <= first["start_ms"] <= admission["start_ms"] + admission["duration_ms"]
