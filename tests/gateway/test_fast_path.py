"""The /v1 POST fast path (stack.gateway.http.openai_fast_path): a plain request is served without FastAPI's
route and answers exactly what the route answers; anything else (a browser's Origin, a chunked upload, a
check that refuses) goes to the route. The upstream is the local OpenAI-compatible stand-in
(bench/harness/mock_upstream.py) as a local engine; its ids and timestamps are the only differences allowed."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stack.config.sections.gateway import GatewayConfig
from stack.gateway.http import endpoint_routes

from .conftest import local, run_gateway, start_mock, stop

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
VOLATILE = re.compile(rb'"(id|created)":\s*("[^"]*"|\d+)')


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    server = start_mock(tmp_path_factory.mktemp("fast"), "m", "--chunks", "3")
    yield server
    stop(server.proc)


@pytest.fixture
def routed(monkeypatch) -> Counter:
    """How many requests FastAPI's /v1 route handled, by endpoint."""
    calls: Counter = Counter()
    forward = endpoint_routes._forward

    async def counted(request, endpoint):
        calls[endpoint] += 1
        return await forward(request, endpoint)

    monkeypatch.setattr(endpoint_routes, "_forward", counted)
    return calls


@pytest.fixture
def gw(engine):
    with run_gateway(GatewayConfig(max_tokens_limit=1000), default_model="m",
                     deployments=[local("engine", engine.url, group="m")]) as gw:  # fmt: skip
        yield gw


def answer(resp: httpx.Response) -> tuple[int, list[tuple[str, str]], bytes]:
    headers = [(k, v) for k, v in resp.headers.multi_items() if k not in ("date", "server")]
    return resp.status_code, headers, VOLATILE.sub(b"", resp.content)


@pytest.mark.parametrize(("path", "body"), [
    ("chat/completions", {**CHAT, "stream": True}),
    ("chat/completions", CHAT),
    ("completions", {"model": "m", "prompt": "hi", "max_tokens": 3, "stream": True}),
    ("embeddings", {"model": "m", "input": "hi"}),
    ("chat/completions", {**CHAT, "model": "no-such-model"}),  # refused by the dispatcher: rendered here too
])  # fmt: skip
def test_a_plain_request_is_answered_as_the_route_answers_it(gw, routed, path, body) -> None:
    fast = answer(httpx.post(f"{gw.url}/v1/{path}", json=body, timeout=10))
    assert sum(routed.values()) == 0, "a plain request went through FastAPI's route"
    # The same request from a browser (Origin): FastAPI's route, CORS and every middleware answer it.
    slow = answer(httpx.post(f"{gw.url}/v1/{path}", json=body, headers={"origin": "http://x"}, timeout=10))
    assert sum(routed.values()) == (1 if fast[0] == 200 else sum(routed.values()))
    assert fast == slow
    assert fast[0] == (404 if body["model"] == "no-such-model" else 200), fast


@pytest.mark.parametrize(("content", "headers", "status", "said"), [
    (b"{not json", {}, 400, b"could not parse the JSON body"),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', {}, 400, b"Missing required parameter: 'model'"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}', {}, 400,
     b"'max_tokens' is too large"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": "maybe"}', {}, 400,
     b"Invalid value for 'stream'"),
    (b"[1, 2]", {}, 400, b"must be a JSON object"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}', {"content-type": "text/plain"}, 400,
     b"must be a JSON object"),  # FastAPI reads no JSON from another content type
])  # fmt: skip
def test_what_a_check_refuses_goes_to_the_route_with_its_body(gw, routed, content, headers, status, said) -> None:
    resp = httpx.post(f"{gw.url}/v1/chat/completions", content=content,
                      headers={"content-type": "application/json", **headers}, timeout=10)  # fmt: skip
    assert resp.status_code == status and said in resp.content, resp.text
    assert sum(routed.values()) == 0  # refused by the route's checks, before routing


def test_a_chunked_upload_goes_to_the_route(gw, routed) -> None:
    def body():
        yield b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
        yield b'"max_tokens": 3}'

    resp = httpx.post(f"{gw.url}/v1/chat/completions", content=body(), headers={"content-type": "application/json"},
                      timeout=10)  # fmt: skip
    assert resp.status_code == 200 and routed["chat"] == 1


def test_a_key_is_checked_and_its_name_logged(engine, routed, caplog) -> None:
    environ = {"VSTACK_TEST_KEY": "sk-fast-path-key-1234567890"}
    settings = GatewayConfig(api_keys=[{"name": "team-a", "env": "VSTACK_TEST_KEY"}], log_requests=True)
    caplog.set_level("INFO", logger="stack.gateway.requests")
    with run_gateway(settings, default_model="m", deployments=[local("engine", engine.url, group="m")],
                     environ=environ) as gw:  # fmt: skip
        ok = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, timeout=10,
                        headers={"authorization": "Bearer sk-fast-path-key-1234567890"})  # fmt: skip
        wrong = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, timeout=10,
                           headers={"authorization": "Bearer sk-wrong"})  # fmt: skip
    assert ok.status_code == 200 and routed["chat"] == 0
    assert wrong.status_code == 401 and "Incorrect API key" in wrong.text
    logged = [r.getMessage() for r in caplog.records if r.name == "stack.gateway.requests"]
    assert '"key":"team-a"' in logged[0] and '"status":200' in logged[0], logged
    assert "sk-fast-path" not in "".join(logged)


def _send_events(app, body: dict, patch_count) -> list[str]:
    """One streamed request through the app's ASGI interface: what it sent, and when it counted the request."""
    events: list[str] = []
    patch_count(lambda: events.append("counted"))
    raw = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5555), "server": ("127.0.0.1", 80),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
             "state": {}}  # fmt: skip

    async def run() -> None:
        done = asyncio.Event()
        messages = [{"type": "http.request", "body": raw, "more_body": False}]

        async def receive() -> dict:
            if messages:
                return messages.pop()
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.body":
                events.append("chunk" if message.get("more_body") else "end")

        async with app.router.lifespan_context(app):
            await app(scope, receive, send)
            done.set()

    asyncio.run(run())
    return events


def test_the_streams_end_goes_out_before_the_requests_bookkeeping(engine, monkeypatch) -> None:
    """The client's last byte does not wait for the counts, the activity row and the slot's release."""
    from stack.gateway.app import create_app
    from stack.gateway.registry import DeploymentRegistry
    from stack.gateway.routing.attempt import Attempt

    def patch_count(record):
        count = Attempt._count

        def counted(self):
            record()
            count(self)

        monkeypatch.setattr(Attempt, "_count", counted)

    registry = DeploymentRegistry()
    registry.add(local("engine", engine.url, group="m"))
    app = create_app(GatewayConfig(), default_model="m", registry=registry)
    events = _send_events(app, {**CHAT, "stream": True}, patch_count)
    assert events[-2:] == ["end", "counted"] and "chunk" in events, events


def test_a_client_closing_right_after_the_last_byte_is_no_abort(gw) -> None:
    """The stream's end goes out before the request's bookkeeping: a client that closes at once is still
    counted as answered (200), never as gone (499)."""
    host, port = gw.url.removeprefix("http://").split(":")
    body = httpx.Request("POST", f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True})
    raw = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
           f"content-length: {len(body.read())}\r\n\r\n").encode() + body.read()  # fmt: skip
    for _ in range(20):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(raw)
            got = b""
            while not got.endswith(b"0\r\n\r\n"):
                data = sock.recv(65536)
                assert data, got
                got += data
        assert b"data: [DONE]" in got
    samples = [s for f in text_string_to_metric_families(httpx.get(f"{gw.url}/metrics", timeout=5).text)
               for s in f.samples if s.name == "vstack_gateway_requests_total"]  # fmt: skip
    counted = {s.labels["status"]: s.value for s in samples if s.labels.get("deployment") == "engine"}
    assert counted == {"200": 20}, counted


def to_engine(url: str, deployment: str) -> tuple[float, float]:
    """(count, sum) of vstack_gateway_time_to_engine_call_seconds for one deployment."""
    name = "vstack_gateway_time_to_engine_call_seconds"
    got = {s.name: s.value for f in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=5).text)
           for s in f.samples if s.name in (f"{name}_count", f"{name}_sum") and s.labels["deployment"] == deployment}
    return got.get(f"{name}_count", 0.0), got.get(f"{name}_sum", 0.0)


def test_each_requests_time_from_arrival_to_its_engine_call_is_measured(gw) -> None:
    """The gateway's own share of a first token (vstack_gateway_time_to_engine_call_seconds), streamed or not,
    on the fast path and on the route's (a chunked upload); never more than the client waited for its answer."""
    count, total = to_engine(gw.url, "engine")
    waited = 0.0
    for body in ({**CHAT, "stream": True}, CHAT, {**CHAT, "stream": True}):
        t0 = time.perf_counter()
        assert httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=30).status_code == 200
        waited += time.perf_counter() - t0
    t0 = time.perf_counter()
    chunked = httpx.post(f"{gw.url}/v1/chat/completions", content=iter([json.dumps(CHAT).encode()]),
                         headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
    waited += time.perf_counter() - t0
    assert chunked.status_code == 200
    after, spent = to_engine(gw.url, "engine")
    assert after == count + 4
    assert 0 < spent - total < waited
