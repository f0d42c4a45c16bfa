"""Hostile requests against the gateway (issue 17): the admin API cannot make the gateway send a secret
anywhere, slow clients are cut off while others are served, bad bodies get named 400s, rejections are
counted, /docs follows /v1's keys, and request logs carry no body and no key.

The cloud provider is bench/harness/mock_upstream.py reached through LiteLLM's OpenAI provider (a cloud provider
is outside our machine: the one fake allowed); the "attacker" is a plain socket on loopback that records
whatever reaches it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from bench.harness.waiting import free_port
from stack.config.sections.gateway import GatewayConfig, KeyRef
from stack.gateway.app import create_app
from stack.gateway.http.serve import uvicorn_config
from stack.gateway.registry import DeploymentRegistry

from .conftest import cloud_entry, run_gateway, start_mock, stop

MSG = [{"role": "user", "content": "hi"}]
KEY, ADMIN, PROVIDER = "sk-client-key-000001", "sk-admin-key-000002", "sk-provider-key-000003"
ENV = {"VSTACK_API_KEY": KEY, "VSTACK_ADMIN_KEY": ADMIN, "VSTACK_TEST_CLOUD_KEY": PROVIDER}


class Listener:
    """A loopback socket that accepts connections and keeps every byte sent to it (the attacker's host)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.received = b""
        self.done = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.done:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(1)
            with contextlib.suppress(OSError):
                self.received += conn.recv(65536)
            conn.close()

    def close(self) -> None:
        self.done = True
        self.thread.join(2)
        self.sock.close()


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory):
    server = start_mock(tmp_path_factory.mktemp("cloud"), "cloud-small", "--chunks", "2")
    yield server
    stop(server.proc)


@pytest.fixture(autouse=True)
def provider_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # The cloud upstream reads provider keys from the process environment at call time.
    monkeypatch.setenv("VSTACK_TEST_CLOUD_KEY", PROVIDER)


@pytest.fixture
def attacker() -> Iterator[Listener]:
    listener = Listener()
    yield listener
    listener.close()


def keyed(cloud_url: str, **extra) -> GatewayConfig:
    return GatewayConfig(
        api_keys=[KeyRef(name="team", env="VSTACK_API_KEY")],
        admin_key=KeyRef(name="admin", env="VSTACK_ADMIN_KEY"),
        cloud=[cloud_entry(cloud_url)],
        retry_backoff_s=0.01,
        **extra,
    )


def admin(gw, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, f"{gw.url}/admin{path}", headers={"Authorization": f"Bearer {ADMIN}"}, **kw)


def chat(gw, model: str, key: str | None = KEY, **body) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{gw.url}/v1/chat/completions", json={"model": model, "messages": MSG, **body},
                      headers=headers, timeout=30)  # fmt: skip


def steal(env: str, url: str, **params) -> dict:
    return {"model_group": "stolen", "kind": "cloud", "cloud": {
        "model_name": "stolen", "litellm_params": {"model": "openai/x", "api_base": f"{url}/v1", **params},
        "api_key_env": env}}  # fmt: skip


# -- 1. the admin API cannot send a secret anywhere --------------------------------------------------------
@pytest.mark.parametrize("env", ["VSTACK_API_KEY", "VSTACK_ADMIN_KEY", "HOME", "PATH", "AWS_SECRET_ACCESS_KEY"])
def test_admin_cannot_send_any_variable_to_any_host(cloud, attacker, env) -> None:
    with run_gateway(keyed(cloud.url), default_model="cloud-small", environ=ENV) as gw:
        r = admin(gw, "POST", "/deployments", json=steal(env, attacker.url))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "provider_key_not_allowed"
        assert "stolen" not in {m["model"] for m in admin(gw, "GET", "/models").json()["models"]}
        assert chat(gw, "stolen").status_code == 404
    assert attacker.received == b""


def test_a_configured_provider_key_goes_only_where_the_config_sends_it(cloud, attacker) -> None:
    with run_gateway(keyed(cloud.url), default_model="cloud-small", environ=ENV) as gw:
        r = admin(gw, "POST", "/deployments", json=steal("VSTACK_TEST_CLOUD_KEY", attacker.url))
        assert r.status_code == 400 and "only be sent where the configuration sends it" in r.text
        assert PROVIDER not in r.text
        # the same key to the same place the configuration names is fine
        ok = steal("VSTACK_TEST_CLOUD_KEY", cloud.url)
        ok["cloud"]["litellm_params"]["model"] = "openai/cloud-small"
        assert admin(gw, "POST", "/deployments", json=ok).status_code == 201
        r = chat(gw, "stolen")
        assert r.status_code == 200, r.text
    assert attacker.received == b""


def test_env_references_and_keyless_runtime_deployments_are_refused(cloud, attacker) -> None:
    with run_gateway(keyed(cloud.url), default_model="cloud-small", environ=ENV) as gw:
        sneaky = steal("VSTACK_TEST_CLOUD_KEY", cloud.url, api_version="os.environ/VSTACK_API_KEY")
        assert admin(gw, "POST", "/deployments", json=sneaky).status_code == 400
        keyless = steal("VSTACK_TEST_CLOUD_KEY", attacker.url)
        keyless["cloud"]["api_key_env"] = None  # LiteLLM would read OPENAI_API_KEY on its own
        r = admin(gw, "POST", "/deployments", json=keyless)
        assert r.status_code == 400 and "must name its key's variable" in r.text
    assert attacker.received == b""


def test_provider_key_envs_is_the_explicit_allowlist(cloud) -> None:
    env = {**ENV, "TEAM_PROVIDER_KEY": PROVIDER}
    with run_gateway(keyed(cloud.url, provider_key_envs=["TEAM_PROVIDER_KEY"]), default_model="cloud-small",
                     environ=env) as gw:  # fmt: skip
        spec = steal("TEAM_PROVIDER_KEY", cloud.url)
        spec["cloud"]["litellm_params"]["model"] = "openai/cloud-small"
        assert admin(gw, "POST", "/deployments", json=spec).status_code == 201


def test_the_gateways_own_keys_cannot_be_provider_keys() -> None:
    with pytest.raises(ValueError, match="gateway's own keys"):
        GatewayConfig(api_keys=[KeyRef(env="VSTACK_API_KEY")],
                      cloud=[{"model_name": "m", "litellm_params": {"model": "openai/m"},
                              "api_key_env": "VSTACK_API_KEY"}])  # fmt: skip
    with pytest.raises(ValueError, match="gateway's own keys"):
        GatewayConfig(admin_key=KeyRef(env="VSTACK_ADMIN_KEY"), provider_key_envs=["VSTACK_ADMIN_KEY"])


# -- 9. validate first, nothing half-registered, ids never collide -----------------------------------------
def test_unknown_provider_is_400_and_nothing_is_registered(cloud) -> None:
    with run_gateway(keyed(cloud.url), default_model="cloud-small", environ=ENV) as gw:
        spec = steal("VSTACK_TEST_CLOUD_KEY", cloud.url)
        spec["cloud"]["litellm_params"]["model"] = "nosuchprovider/x"
        r = admin(gw, "POST", "/deployments", json=spec)
        assert r.status_code == 400 and "LiteLLM has no provider 'nosuchprovider'" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "cloud.litellm_params.model"
        assert [d.id for d in gw.state.registry.all()] == ["cloud-cloud-small-1"]
        assert "stolen" not in {m["model"] for m in admin(gw, "GET", "/models").json()["models"]}


def test_generated_ids_skip_ids_given_by_hand(cloud) -> None:
    with run_gateway(GatewayConfig(), default_model="smol") as gw:
        first = {"model_group": "smol", "api_base": cloud.url, "id": "local-1"}
        assert httpx.post(f"{gw.url}/admin/deployments", json=first).status_code == 201
        r = httpx.post(f"{gw.url}/admin/deployments", json={"model_group": "smol", "api_base": cloud.url})
        assert r.status_code == 201, r.text
        assert r.json()["id"] not in ("local-1", None)


# -- 10. bodies, retries, rejections, request logs ----------------------------------------------------------
@pytest.mark.parametrize(("raw", "words"), [(b"", "JSON object"), (b"null", "JSON object"), (b"[]", "JSON object")])
def test_empty_or_null_body_says_what_is_wrong(cloud, raw, words) -> None:
    with run_gateway(GatewayConfig(cloud=[cloud_entry(cloud.url)]), default_model="cloud-small", environ=ENV) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert words in r.json()["error"]["message"] and "None" not in r.json()["error"]["message"]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "n", "seed", "top_logprobs"])
def test_booleans_are_not_integers(cloud, field) -> None:
    with run_gateway(GatewayConfig(cloud=[cloud_entry(cloud.url)]), default_model="cloud-small", environ=ENV) as gw:
        r = chat(gw, "cloud-small", key=None, **{field: True})
        assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_a_retry_of_the_same_deployment_is_not_a_fallback(cloud) -> None:
    failing = {**cloud_entry(cloud.url), "litellm_params": {"model": "openai/status-500",
                                                            "api_base": f"{cloud.url}/v1"}}  # fmt: skip
    settings = GatewayConfig(cloud=[failing], num_retries=2, retry_backoff_s=0.01)
    with run_gateway(settings, default_model="cloud-small", environ=ENV) as gw:
        assert chat(gw, "cloud-small", key=None).status_code >= 500
        metrics = httpx.get(f"{gw.url}/metrics").text
    failures = [ln for ln in metrics.splitlines() if ln.startswith("vstack_gateway_upstream_errors_total{")]
    assert failures and float(failures[0].rsplit(" ", 1)[1]) == 3  # tried three times...
    assert "vstack_gateway_fallbacks_total{" not in metrics  # ...and never "fell back" to itself


def test_rejections_are_counted_by_status_and_reason(cloud) -> None:
    with run_gateway(keyed(cloud.url, max_body_bytes=2048), default_model="cloud-small", environ=ENV) as gw:
        assert chat(gw, "cloud-small", key=None).status_code == 401
        assert chat(gw, "cloud-small", key="wrong").status_code == 401
        assert chat(gw, "nosuch").status_code == 404
        assert chat(gw, "cloud-small", temperature="hot").status_code == 400
        big = httpx.post(f"{gw.url}/v1/chat/completions", content=b"x" * 4096,
                         headers={"Authorization": f"Bearer {KEY}"})
        assert big.status_code == 413
        text = httpx.get(f"{gw.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    for status, reason in [("401", "missing_api_key"), ("401", "invalid_api_key"), ("404", "model_not_found"),
                           ("400", "invalid_body"), ("413", "request_too_large")]:  # fmt: skip
        assert f'vstack_gateway_rejected_requests_total{{reason="{reason}",status="{status}"}} 1.0' in text, reason


def test_request_log_has_one_line_per_request_without_bodies_or_keys(cloud, caplog) -> None:
    caplog.set_level(logging.INFO, logger="stack.gateway.requests")
    with run_gateway(keyed(cloud.url, log_requests=True), default_model="cloud-small", environ=ENV) as gw:
        assert chat(gw, "cloud-small", user="private-user-text").status_code == 200
        assert chat(gw, "cloud-small", key="sk-wrong-key-999999").status_code == 401
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "stack.gateway.requests"]
    assert [(x["path"], x["status"]) for x in lines] == [("/v1/chat/completions", 200), ("/v1/chat/completions", 401)]
    assert lines[0]["key"] == "team" and lines[0]["deployment"] == "cloud-cloud-small-1" and lines[0]["ms"] > 0
    text = caplog.text
    for secret in (KEY, "sk-wrong-key-999999", PROVIDER, "private-user-text", "hi"):
        assert secret not in text.replace("\"hi", "")  # no key, no body


def test_request_log_is_off_by_default(cloud, caplog) -> None:
    caplog.set_level(logging.INFO, logger="stack.gateway.requests")
    with run_gateway(keyed(cloud.url), default_model="cloud-small", environ=ENV) as gw:
        assert chat(gw, "cloud-small").status_code == 200
    assert not [r for r in caplog.records if r.name == "stack.gateway.requests"]


# -- 4. /docs and /openapi.json follow /v1's auth ----------------------------------------------------------
def test_docs_need_the_v1_key_when_keys_are_set(cloud) -> None:
    with run_gateway(keyed(cloud.url), default_model="cloud-small", environ=ENV) as gw:
        for path in ("/openapi.json", "/docs"):
            assert httpx.get(f"{gw.url}{path}").status_code == 401
            assert httpx.get(f"{gw.url}{path}", headers={"Authorization": "Bearer nope"}).status_code == 401
            assert httpx.get(f"{gw.url}{path}", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert httpx.get(f"{gw.url}/redoc").status_code == 404


def test_docs_open_without_keys_and_off_by_switch() -> None:
    with run_gateway(GatewayConfig(), default_model="smol") as gw:
        assert "/v1/chat/completions" in httpx.get(f"{gw.url}/openapi.json").json()["paths"]
    with run_gateway(GatewayConfig(docs=False), default_model="smol") as gw:
        assert httpx.get(f"{gw.url}/openapi.json").status_code == 404
        assert httpx.get(f"{gw.url}/docs").status_code == 404


# -- 2. slow clients ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def production_server(settings: GatewayConfig) -> Iterator[tuple[str, int]]:
    """The gateway under the very uvicorn configuration `vstack up` uses (stack.gateway.http.serve)."""
    import asyncio

    import uvicorn

    app = create_app(settings, default_model="smol", registry=DeploymentRegistry(), environ={})
    port = free_port()
    server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port, 1, "warning", limits=settings))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield "127.0.0.1", port
    finally:
        server.should_exit = True
        thread.join(10)
        loop.close()


def closed_after(sock: socket.socket, limit: float, trickle: bytes = b"") -> tuple[float, bytes]:
    """Seconds until the server closes `sock` (sending `trickle` one byte every 0.2 s meanwhile), and what
    it answered. Fails past `limit`."""
    t0, got, i = time.monotonic(), b"", 0
    sock.settimeout(0.2)
    while time.monotonic() - t0 < limit:
        if i < len(trickle):
            with contextlib.suppress(OSError):
                sock.send(trickle[i : i + 1])
            i += 1
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - t0, got
        if not chunk:
            return time.monotonic() - t0, got
        got += chunk
    raise AssertionError(f"still open after {limit} s (answered {got[:80]!r})")


@pytest.mark.solo  # a time window: nothing runs beside it (tests/conftest.py)
def test_slow_clients_are_cut_off_while_others_are_served() -> None:
    settings = GatewayConfig(header_timeout_s=1, body_timeout_s=1.5, keep_alive_s=1)
    with production_server(settings) as (host, port):
        socks = [socket.create_connection((host, port)) for _ in range(5)]
        silent, trickling_headers, trickling_body, idle, second = socks
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        trickling_body.sendall(head + b"Content-Length: 100\r\n\r\n{")
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        second.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # answered; then a second request trickles
        results: dict[str, tuple[float, bytes]] = {}
        threads = [
            threading.Thread(target=lambda n=n, s=s, t=t: results.__setitem__(n, closed_after(s, 8, t)))
            for n, s, t in [("silent", silent, b""), ("headers", trickling_headers, head * 20),
                            ("body", trickling_body, b'"model":"smol"' * 10), ("idle", idle, b""),
                            ("second", second, head * 20)]
        ]  # fmt: skip
        for t in threads:
            t.start()
        # Meanwhile other clients are served, each at once.
        for _ in range(5):
            t0 = time.monotonic()
            assert httpx.get(f"http://{host}:{port}/health", timeout=2).status_code == 200
            assert time.monotonic() - t0 < 1
            time.sleep(0.2)
        for t in threads:
            t.join(10)
        for s in socks:
            s.close()
    assert set(results) == {"silent", "headers", "body", "idle", "second"}
    assert 0.8 < results["silent"][0] < 3 and b"408" in results["silent"][1]
    assert 0.8 < results["headers"][0] < 3 and b"408" in results["headers"][1]  # trickling does not extend it
    assert 1.2 < results["body"][0] < 4 and b"408" in results["body"][1]
    assert results["idle"][1].startswith(b"HTTP/1.1 200") and results["idle"][0] < 4
    assert results["second"][1].startswith(b"HTTP/1.1 200") and b"408" in results["second"][1]
    assert results["second"][0] < 4  # the keep-alive connection's next request has its own header deadline
