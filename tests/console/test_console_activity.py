"""Requests through /v1 land in the console's Activity (its JSON, its CSV and its event stream, live) with their
route, status, TTFT and tokens, and without their bodies or any key. The upstream is the cloud-provider stand-in
(bench/harness/mock_upstream.py, reached through LiteLLM): a cloud provider is outside this machine."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from bench.harness.waiting import free_port
from stack.config.sections.gateway import GatewayConfig
from tests.gateway.conftest import cloud_entry, run_gateway, start_mock, stop

PROVIDER_KEY = "sk-provider-secret-0123456789"
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory):
    server = start_mock(tmp_path_factory.mktemp("mock"), "cloud-small", "--chunks", "8")  # answers as cloud-small
    yield server
    stop(server.proc)


def activity_events(lines, want: int) -> list[dict]:
    """The records the `activity` events carry (each a list: the requests of one second), until `want`."""
    events, topic = [], None
    for line in lines:
        if line.startswith("event: "):
            topic = line.removeprefix("event: ")
        elif line.startswith("data: ") and topic == "activity":
            events += json.loads(line.removeprefix("data: "))
            if len(events) >= want:
                return events
    return events


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_requests_show_in_activity_live_with_route_tokens_and_no_body_or_key(cloud, monkeypatch) -> None:
    monkeypatch.setenv("VSTACK_TEST_CLOUD_KEY", PROVIDER_KEY)  # the provider key LiteLLM sends to the stand-in
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: the request fails
    settings = GatewayConfig(cloud=[cloud_entry(cloud.url), cloud_entry(dead, group="gone")], num_retries=0)
    with run_gateway(settings, default_model="cloud-small", environ={"VSTACK_TEST_CLOUD_KEY": PROVIDER_KEY}) as gw:
        page = httpx.Client(base_url=gw.url, timeout=30)
        assert page.get("/ui/activity").status_code == 200  # an open gateway: this loopback browser's session
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
        with page.stream("GET", "/ui/api/events?topics=activity") as stream:
            lines = stream.iter_lines()
            assert next(lines) == "retry: 3000"  # the stream is open: what follows is pushed to it
            asked = [{"role": "user", "content": QUESTION}]
            client.chat.completions.create(model="cloud-small", messages=asked, max_tokens=8)
            chunks = list(client.chat.completions.create(model="cloud-small", messages=asked, max_tokens=8,
                                                         stream=True))  # fmt: skip
            assert chunks
            with pytest.raises(openai.APIStatusError):
                client.chat.completions.create(model="gone", messages=asked, max_tokens=8)
            live = activity_events(lines, 3)
        assert [e["model"] for e in live] == ["cloud-small", "cloud-small", "gone"]
        plain, streamed, failed = live
        assert plain["route"] == streamed["route"] == "cloud" and plain["status"] == streamed["status"] == "200"
        assert plain["tokens_in"] == 5 and plain["tokens_out"] and plain["ttft_ms"] is None
        assert streamed["ttft_ms"] is not None and streamed["ttft_ms"] <= streamed["duration_ms"]
        assert not failed["status"].startswith("2") and failed["deployment"] == "-"
        rows = page.get("/ui/api/activity").json()["requests"]
        assert [r["id"] for r in rows] == [failed["id"], streamed["id"], plain["id"]]
        assert [r["model"] for r in page.get("/ui/api/activity?status=error").json()["requests"]] == ["gone"]
        csv = page.get("/ui/api/activity?format=csv&model=cloud-small").text
        assert len(csv.splitlines()) == 3 and ",cloud,200," in csv
        for text in (json.dumps(rows), csv):
            assert QUESTION not in text and PROVIDER_KEY not in text and "Paris" not in text


def test_requests_refused_before_routing_show_in_activity_with_their_reason() -> None:
    """Issue 50: a load test at an embedding model failed 4,642 times and none showed in Activity. A wrong key,
    a body that does not parse, an unknown model and a model of another task are listed, route `refused`."""
    from stack.gateway.registry import Deployment
    from tests.console.test_console_access import USER, login

    settings = GatewayConfig.model_validate({"api_keys": [{"name": "team", "env": "K"}]})
    embedder = Deployment(id="engine-emb", model_group="emb", kind="local", upstream_model="emb",
                          api_base=f"http://127.0.0.1:{free_port()}", labels={"task": "embed"})  # fmt: skip
    with run_gateway(settings, default_model="emb", deployments=[embedder], environ={"K": USER}) as gw:
        chat = f"{gw.url}/v1/chat/completions"
        asked = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4}
        key = {"Authorization": f"Bearer {USER}"}
        assert httpx.post(chat, json={"model": "emb", **asked}).status_code == 401
        assert httpx.post(chat, json={"model": "ghost", **asked}, headers=key).status_code == 404
        assert httpx.post(chat, json={"model": "emb", **asked}, headers=key).status_code == 400
        # a body that does not parse (the fields of one that does are the engine's to judge: adr/0047)
        assert httpx.post(chat, content=b'{"model": "emb",', headers={**key, "Content-Type": "application/json"}
                          ).status_code == 400  # fmt: skip
        page, _ = login(gw.url, USER)
        rows = page.get("/ui/api/activity").json()["requests"][::-1]  # oldest first
    seen = [(r["model"], r["status"], r["route"], r["why"], r["endpoint"]) for r in rows]
    assert seen == [("-", "401", "refused", "missing_api_key", "chat"),
                    ("ghost", "404", "refused", "model_not_found", "chat"),
                    ("emb", "400", "refused", "model_task_mismatch", "chat"),
                    ("-", "400", "refused", "invalid_body", "chat")]  # fmt: skip
    assert USER not in str(rows) and QUESTION not in str(rows)
