"""Routing through the mock upstreams (the cloud stand-in is a local OpenAI-compatible server):
local first, fallbacks on errors, context-window fallback, 503 / 429, the deployment header, metrics."""

from __future__ import annotations

import httpx
import openai
import pytest

from bench.harness.waiting import free_port, wait_for
from stack.config.sections.gateway import GatewayConfig

from .conftest import cloud_entry, local, run_gateway, start_mock, stop

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def engine_mock(tmp_path_factory: pytest.TempPathFactory):
    server = start_mock(tmp_path_factory.mktemp("engine"), "engine", "--chunks", "5")
    yield server
    stop(server.proc)


@pytest.fixture(autouse=True)
def _cloud_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VSTACK_TEST_CLOUD_KEY", "sk-test-cloud-key-123456")


def client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def test_local_first_then_header_and_metrics(engine_mock, cloud_mock) -> None:
    settings = GatewayConfig(cloud=[cloud_entry(cloud_mock.url, group="smol", order=2)])
    with run_gateway(settings, default_model="smol", deployments=[local("local-a", engine_mock.url, "smol")]) as gw:
        raw = client(gw.url).chat.completions.with_raw_response.create(model="default", messages=MSG)
        assert raw.headers["x-vstack-deployment"] == "local-a"
        stream = client(gw.url).chat.completions.create(model="smol", messages=MSG, stream=True)
        chunks = list(stream)
        assert all(c.usage is None for c in chunks)  # usage we asked for on the client's behalf is dropped
        # A stream is counted when the gateway has sent its last byte, which may be just after the client read
        # it: the figures are awaited (up to seconds on a busy machine), not read once.
        requests = 'vstack_gateway_requests_total{deployment="local-a",model="smol",status="200"} 2.0'
        wait_for(lambda: requests in httpx.get(f"{gw.url}/metrics").text, 10, "both requests counted")
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert 'vstack_gateway_tokens_total{deployment="local-a",direction="completion",model="smol"} 10.0' in metrics


def test_dead_engine_falls_back_to_cloud_without_client_error(cloud_mock) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    settings = GatewayConfig(cloud=[cloud_entry(cloud_mock.url)], fallbacks={"smol": ["cloud-small"]})
    with run_gateway(settings, default_model="smol", deployments=[local("local-a", dead, "smol")]) as gw:
        raw = client(gw.url).chat.completions.with_raw_response.create(model="smol", messages=MSG)
        assert raw.headers["x-vstack-deployment"].startswith("cloud-cloud-small")
        assert raw.headers["x-vstack-fallback"] == "connect"
        assert raw.parse().choices[0].message.content.startswith("tok")
        chunks = list(client(gw.url).chat.completions.create(model="smol", messages=MSG, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith("tok")
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert 'vstack_gateway_fallbacks_total{from_model="smol",reason="connect",to_model="cloud-small"}' in metrics


def test_no_fallback_gives_clean_503_with_retry_after() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with run_gateway(GatewayConfig(), default_model="smol", deployments=[local("local-a", dead, "smol")]) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "smol", "messages": MSG})
        assert r.status_code == 503
        assert r.headers["retry-after"] == "5"
        assert r.json()["error"]["code"] == "no_deployment_available"
        assert httpx.get(f"{gw.url}/ready").status_code in (200, 503)


def test_upstream_500_is_retried_then_falls_back(engine_mock, cloud_mock) -> None:
    settings = GatewayConfig(cloud=[cloud_entry(cloud_mock.url)], fallbacks={"smol": ["cloud-small"]},
                             retry_backoff_s=0.01)  # fmt: skip
    failing = local("local-a", engine_mock.url, "smol", upstream="status-500")
    with run_gateway(settings, default_model="smol", deployments=[failing]) as gw:
        raw = client(gw.url).chat.completions.with_raw_response.create(model="smol", messages=MSG)
        assert raw.headers["x-vstack-deployment"].startswith("cloud-")
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert 'vstack_gateway_upstream_errors_total{deployment="local-a",reason="error"} 2.0' in metrics


def test_context_window_fallback(engine_mock, cloud_mock) -> None:
    settings = GatewayConfig(cloud=[cloud_entry(cloud_mock.url, group="big")],
                             context_window_fallbacks={"smol": ["big"]})  # fmt: skip
    small = local("local-a", engine_mock.url, "smol", upstream="context-2048")
    with run_gateway(settings, default_model="smol", deployments=[small]) as gw:
        raw = client(gw.url).chat.completions.with_raw_response.create(model="smol", messages=MSG)
        assert raw.headers["x-vstack-fallback"] == "context_window"


def test_context_too_long_without_fallback_is_400_passed_through(engine_mock) -> None:
    small = local("local-a", engine_mock.url, "smol", upstream="context-2048")
    with run_gateway(GatewayConfig(), default_model="smol", deployments=[small]) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "smol", "messages": MSG})
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]


def test_upstream_429_everywhere_is_429(engine_mock) -> None:
    limited = local("local-a", engine_mock.url, "smol", upstream="status-429")
    with run_gateway(GatewayConfig(retry_backoff_s=0.01), default_model="smol", deployments=[limited]) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "smol", "messages": MSG})
        assert r.status_code == 429
        assert "retry-after" in r.headers


def test_aliases_models_list_and_runtime_registration(engine_mock) -> None:
    settings = GatewayConfig(aliases={"fast": "smol"})
    with run_gateway(settings, default_model="smol") as gw:
        assert httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "fast", "messages": MSG}).status_code == 404
        spec = {"model_group": "smol", "api_base": engine_mock.url, "id": "engine-1"}
        r = httpx.post(f"{gw.url}/admin/deployments", json=spec)
        assert r.status_code == 201, r.text
        ids = {m.id for m in client(gw.url).models.list()}
        assert {"smol", "fast", "default"} <= ids
        raw = client(gw.url).chat.completions.with_raw_response.create(model="fast", messages=MSG)
        assert raw.headers["x-vstack-deployment"] == "engine-1"
        models = httpx.get(f"{gw.url}/admin/models").json()["models"]
        assert models[0]["state"] == "ready" and models[0]["aliases"] == ["default", "fast"]
        gw.call(gw.state.registry.set_state, "engine-1", "starting")  # what the model manager does
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "fast", "messages": MSG})
        assert r.status_code == 503 and "is starting" in r.json()["error"]["message"]
        assert httpx.get(f"{gw.url}/ready").status_code == 503
        assert httpx.delete(f"{gw.url}/admin/deployments/engine-1").status_code == 200
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "fast", "messages": MSG})
        assert r.status_code == 404  # nothing serves or will serve it any more


def test_engine_metrics_are_reachable_through_the_gateway(engine_mock) -> None:
    with run_gateway(GatewayConfig(), default_model="smol", deployments=[local("e1", engine_mock.url, "smol")]) as gw:
        assert "mock_served_total" in httpx.get(f"{gw.url}/metrics/engines/e1").text
        targets = httpx.get(f"{gw.url}/metrics/targets").json()
        assert targets[0]["labels"]["__metrics_path__"] == "/metrics/engines/e1"
        gw.call(gw.state.registry.set_state, "e1", "stopped")  # a stopped engine is no scrape target
        assert httpx.get(f"{gw.url}/metrics/targets").json() == []


def test_completions_and_embeddings_pass_through(engine_mock) -> None:
    with run_gateway(GatewayConfig(), default_model="smol", deployments=[local("e1", engine_mock.url, "smol")]) as gw:
        c = client(gw.url)
        assert c.completions.create(model="smol", prompt="hi", max_tokens=3).choices[0].text == "tok tok tok "
        assert len(c.embeddings.create(model="smol", input=["a", "b"]).data) == 2


def test_every_attempt_gives_back_what_it_held(engine_mock, cloud_mock) -> None:
    """One exit stack per request, one context manager per attempt (adr/0028): a failed attempt fallen back
    from, a whole answer and a stream each leave nothing counted in flight, and only answers are counted."""
    settings = GatewayConfig(cloud=[cloud_entry(cloud_mock.url)], fallbacks={"smol": ["cloud-small"]},
                             retry_backoff_s=0.01, routing_strategy="least-busy")  # fmt: skip
    failing = local("local-a", engine_mock.url, "smol", upstream="status-500")
    with run_gateway(settings, default_model="smol", deployments=[failing]) as gw:
        client(gw.url).chat.completions.create(model="smol", messages=MSG)
        list(client(gw.url).chat.completions.create(model="smol", messages=MSG, stream=True))
        state = gw.app.state.gateway
        # The client has read [DONE] a moment before the server's stream closes its attempt: wait for that
        # (a few ms); a leak would stay at 1 and time out here.
        wait_for(lambda: state.dispatcher.in_flight == 0, timeout=5, what="the stream's attempt given back")
        assert set(state.routing.replicas.outstanding.values()) == {0}, state.routing.replicas.outstanding
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert 'vstack_gateway_requests_total{deployment="local-a"' not in metrics  # it never answered
        assert 'deployment="cloud-cloud-small-1",model="smol",status="200"} 2.0' in metrics
