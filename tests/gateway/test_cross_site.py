"""What a web page can make the operator's browser send, against a gateway without an admin key (issue 49, item 1;
adr/0039). A gateway app in a thread with the manager's stand-in engines (tests/manager): no engine starts.

- a form post (or a text/plain fetch) from another origin to /admin or a console action is refused and the
  model keeps serving; the same change from a program (JSON or no body, no Origin) still goes through;
- a DNS-rebinding `Host` gets 421 on /admin, /ui and (no client key) /v1, never on /health;
- `vstack up`'s admin token: /admin needs it, `vstack` reads it from state_dir, a web page cannot.
"""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import pytest

from bench.harness.gateway_thread import app_in_thread
from stack.config.sections.gateway import GatewayConfig
from stack.gateway.app import create_app
from tests.manager.conftest import StandIn, build

from .conftest import local, run_gateway

EVIL = "http://evil.example"


@pytest.fixture
def managed():
    engine = StandIn("m")
    # the route the supervisor would register for the engine (never asked here: no request goes to `m`)
    with run_gateway(
        GatewayConfig(),
        default_model="m",
        manager=build([engine]),
        deployments=[local("engine-m", "http://127.0.0.1:9", "m")],
    ) as gw:
        assert httpx.post(f"{gw.url}/admin/models/m/load", timeout=30).json()["state"] == "ready"
        yield gw, engine


def state_of(gw) -> str:
    return httpx.get(f"{gw.url}/admin/models").json()["models"][0]["manager"]["state"]


def test_a_cross_site_form_post_cannot_put_a_model_to_sleep(managed) -> None:
    gw, engine = managed
    url = f"{gw.url}/admin/models/m/sleep?wait=false"
    form = httpx.post(url, data={"x": "1"}, headers={"Origin": EVIL, "Sec-Fetch-Site": "cross-site"})
    assert form.status_code == 403 and form.json()["error"]["code"] == "cross_site"
    assert "never from another site's page" in form.json()["error"]["message"]
    # a page's fetch(mode: no-cors) with a text body and no Origin the browser would name (a privacy setting)
    plain = httpx.post(url, content=b"{}", headers={"Content-Type": "text/plain;charset=UTF-8"})
    assert plain.status_code == 415 and plain.json()["error"]["code"] == "json_required"
    only_fetch_metadata = httpx.post(url, headers={"Sec-Fetch-Site": "same-site"})
    assert only_fetch_metadata.status_code == 403
    console = httpx.post(f"{gw.url}/ui/api/models/m/sleep", data={"a": "b"}, headers={"Origin": EVIL})
    assert console.status_code == 403
    assert state_of(gw) == "ready" and engine.running and engine.sleeps == 0
    # the CLI's own call (no body, no Origin) still changes it: the refusals above were not for any POST
    assert httpx.post(url).json() == {"model": "m", "action": "sleep", "accepted": True}


def test_a_rebinding_host_gets_421_everywhere_but_health(managed) -> None:
    gw, _ = managed
    port = gw.url.rsplit(":", 1)[1]
    evil = {"Host": f"rebind.test:{port}"}
    for path in ("/admin/models", "/ui/models", "/v1/models", "/metrics"):
        r = httpx.get(f"{gw.url}{path}", headers=evil)
        assert r.status_code == 421, path
        assert "does not serve the host name 'rebind.test'" in r.json()["error"]["message"]
        assert "gateway.allowed_hosts" in r.json()["error"]["message"]
    assert httpx.post(f"{gw.url}/admin/models/m/sleep", headers=evil).status_code == 421
    assert httpx.get(f"{gw.url}/health", headers=evil).status_code == 200
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "[::1]", "127.0.0.1:18000", "app.localhost"):
        assert httpx.get(f"{gw.url}/admin/models", headers={"Host": host}).status_code == 200, host
    assert state_of(gw) == "ready"


def test_allowed_hosts_admit_a_published_name() -> None:
    settings = GatewayConfig(allowed_hosts=["gateway", ".corp.example"])
    with app_in_thread(create_app(settings, default_model="m", environ={})) as (url, _loop):
        for host, status in (("gateway:8000", 200), ("llm.corp.example", 200), ("corp.example", 200),
                             ("evilcorp.example", 421)):  # fmt: skip
            assert httpx.get(f"{url}/admin/models", headers={"Host": host}).status_code == status, host


def test_with_a_client_key_v1_keeps_any_host_name() -> None:
    """A keyed /v1 is no rebinding prize (the page lacks the key), and a published gateway's clients name it as
    they like: only /admin and /ui check the name there."""
    settings = GatewayConfig.model_validate({"api_keys": [{"name": "k", "env": "K"}]})
    with app_in_thread(create_app(settings, default_model="m", environ={"K": "sk-1"})) as (url, _loop):
        auth = {"Authorization": "Bearer sk-1", "Host": "api.example.org"}
        assert httpx.get(f"{url}/v1/models", headers=auth).status_code == 200
        assert httpx.get(f"{url}/admin/models", headers={"Host": "api.example.org"}).status_code == 421


def test_the_admin_token_opens_admin_and_vstack_reads_it(tmp_path: Path, monkeypatch) -> None:
    from stack.cli.status_cmd import _model_rows
    from stack.manager.client import admin, admin_headers

    monkeypatch.delenv("VSTACK_ADMIN_KEY", raising=False)
    token_file = tmp_path / "admin-token"
    app = create_app(GatewayConfig(), default_model="m", environ={}, admin_token_file=token_file)
    token = token_file.read_text().strip()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and len(token) >= 32
    with app_in_thread(app) as (url, _loop):
        bare = httpx.get(f"{url}/admin/models")
        assert bare.status_code == 401 and bare.json()["error"]["code"] == "admin_token_required"
        assert "admin-token" in bare.json()["error"]["message"]
        assert httpx.get(f"{url}/admin/models", headers={"Authorization": "Bearer guess"}).status_code == 401
        ok = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{url}/admin/models", headers=ok).status_code == 200
        # a proxy on this machine relays other hosts' clients: they are not local, token or not
        relayed = httpx.get(f"{url}/admin/models", headers={**ok, "X-Forwarded-For": "203.0.113.9"})
        assert relayed.status_code == 403
        # the CLI's side: read from state_dir, sent to this machine's gateway only
        assert admin_headers(url, tmp_path) == ok
        assert admin_headers("http://gpu-box.example:8000", tmp_path) == {}
        assert admin(tmp_path, "GET", "/admin/models", url=url)["default"] == "m"
        # `vstack status` without the token: says the gateway needs a key instead of "starting"
        rows = _model_rows(url, {}, tmp_path / "elsewhere")
        assert rows[0]["state"] == "answers (admin key needed to list its models)"
        assert "VSTACK_ADMIN_KEY is not set" in rows[0]["warnings"][0]
        # the console: no admin role without the token; logging in with it gives it
        c = httpx.Client(base_url=url)
        assert 'name="console-role" content="viewer"' in c.get("/ui/models").text
        assert c.post("/ui/login", json={"key": token}).json() == {"role": "admin", "key_name": "admin-token"}
    assert not token_file.exists()  # withdrawn at shutdown


def test_a_loopback_clients_forwarded_for_does_not_name_the_request_logs_client(caplog) -> None:
    """uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise: any local process could name the
    request log's client. The gateway's server believes only gateway.trusted_proxies."""
    import asyncio
    import logging
    import threading
    import time

    import uvicorn

    from bench.harness.waiting import free_port
    from stack.gateway.http.serve import uvicorn_config

    assert uvicorn_config(create_app(GatewayConfig(), default_model="m"), "127.0.0.1", 0, 1).proxy_headers is False
    trusting = GatewayConfig(trusted_proxies=["10.0.0.0/8"])
    config = uvicorn_config(create_app(trusting, default_model="m"), "127.0.0.1", 0, 1, limits=trusting)
    assert config.proxy_headers is True and config.forwarded_allow_ips == "10.0.0.0/8"

    settings = GatewayConfig(log_requests=True)
    port = free_port()
    server = uvicorn.Server(uvicorn_config(create_app(settings, default_model="m"), "127.0.0.1", port, 1,
                                           limits=settings))  # fmt: skip
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), daemon=True)
    caplog.set_level(logging.INFO, logger="stack.gateway.requests")
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        r = httpx.get(f"http://127.0.0.1:{port}/health", headers={"X-Forwarded-For": "203.0.113.50"})
        assert r.status_code == 200
    finally:
        server.should_exit = True
        thread.join(10)
        loop.close()
    (line,) = [rec.getMessage() for rec in caplog.records if rec.name == "stack.gateway.requests"]
    assert '"client":"127.0.0.1"' in line and "203.0.113.50" not in line
