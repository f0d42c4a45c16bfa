"""The console's rules without an engine: login, cookie, CSRF, roles, bad actions, no secret in any answer,
bounded event streams. A real gateway app (create_app) served by uvicorn in a thread; no upstream is needed."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from bench.harness.gateway_thread import app_in_thread
from stack.config.sections.gateway import GatewayConfig
from stack.gateway.app import create_app
from stack.gateway.console.hub import Hub, TooManyStreams
from tests.support.kv_console import kv_console

USER, ADMIN = "user-secret-key-0123456789", "admin-secret-key-9876543210"
PAGES = ["models", "live", "activity", "keys", "logs", "playground", "plan"]
APIS = ["/ui/api/models", "/ui/api/activity", "/ui/api/activity?format=csv", "/ui/api/logs", "/ui/api/live",
        "/ui/api/plan", "/ui/api/keys"]  # fmt: skip


@pytest.fixture(scope="module")
def keyed():
    settings = GatewayConfig.model_validate({"api_keys": [{"name": "team", "env": "K"}],
                                             "admin_key": {"name": "ops", "env": "A"}})  # fmt: skip
    app = create_app(settings, default_model="m", environ={"K": USER, "A": ADMIN})
    with app_in_thread(app) as (url, _loop):
        yield url


def login(url: str, key: str) -> tuple[httpx.Client, str]:
    c = httpx.Client(base_url=url)
    r = c.post("/ui/login", json={"key": key})
    assert r.status_code == 200, r.text
    page = c.get("/ui/models").text
    csrf = page.split('name="csrf-token" content="')[1].split('"')[0]
    return c, csrf


def test_pages_need_a_login_when_keys_are_set(keyed: str) -> None:
    c = httpx.Client(base_url=keyed)
    for page in PAGES:
        r = c.get(f"/ui/{page}")
        assert r.status_code == 303 and r.headers["location"] == f"/ui/login?next=/ui/{page}"
    for api in APIS:
        r = c.get(api)
        assert r.status_code == 401 and r.json()["error"]["code"] == "console_login_required"
    r = c.post("/ui/login", json={"key": "not-a-key"})
    assert r.status_code == 401 and "Incorrect key" in r.json()["error"]["message"]
    assert "not-a-key" not in r.text and "set-cookie" not in r.headers


def test_login_sets_an_httponly_strict_cookie_and_gives_the_role(keyed: str) -> None:
    for key, role in ((USER, "viewer"), (ADMIN, "admin")):
        r = httpx.post(f"{keyed}/ui/login", json={"key": key})
        assert r.status_code == 200 and r.json() == {"role": role, "key_name": "team" if role == "viewer" else "ops"}
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
        assert key not in cookie


def test_no_secret_in_any_page_or_answer(keyed: str) -> None:
    for key in (USER, ADMIN):
        c, _ = login(keyed, key)
        bodies = [c.get(f"/ui/{p}").text for p in PAGES] + [c.get(a).text for a in APIS]
        bodies += [c.get("/ui/login").text, c.get("/ui/static/console.js").text]
        for body in bodies:
            assert USER not in body and ADMIN not in body


def test_a_post_without_the_csrf_token_is_refused(keyed: str) -> None:
    c, csrf = login(keyed, ADMIN)
    r = c.post("/ui/api/models/m/load")
    assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed"
    r = c.post("/ui/api/models/m/load", headers={"X-CSRF-Token": "guess"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed"
    r = c.post("/ui/api/chat", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed"
    # Another site's page posting with the browser's cookie: refused by its Origin even with a token.
    r = c.post("/ui/api/models/m/load", headers={"X-CSRF-Token": csrf, "Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "cross_site"


def test_the_api_key_session_cannot_press_admin_buttons(keyed: str) -> None:
    c, csrf = login(keyed, USER)
    for action in ("load", "sleep", "unload", "switch"):
        r = c.post(f"/ui/api/models/m/{action}", headers={"X-CSRF-Token": csrf})
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_required"
        assert "admin key" in r.json()["error"]["message"]


def test_bad_actions_get_a_clear_message_and_change_nothing(keyed: str) -> None:
    c, csrf = login(keyed, ADMIN)
    r = c.post("/ui/api/models/m/explode", headers={"X-CSRF-Token": csrf})
    assert r.status_code == 400 and "load, unload, switch or sleep" in r.json()["error"]["message"]
    r = c.post("/ui/api/models/m/load", headers={"X-CSRF-Token": csrf})  # this gateway starts no engine
    assert r.status_code == 400 and "no model manager" in r.json()["error"]["message"]
    assert c.get("/ui/api/models").json()["models"] == []


def test_logout_ends_the_session(keyed: str) -> None:
    c, csrf = login(keyed, USER)
    assert c.post("/ui/logout", headers={"X-CSRF-Token": csrf}).status_code == 200
    assert c.get("/ui/api/models").status_code == 401


def test_an_open_gateway_gives_loopback_the_admin_role_without_a_login() -> None:
    """No key anywhere: /admin/* answers loopback clients, so does the console (and only them)."""
    app = create_app(GatewayConfig(), default_model="m", environ={})
    with app_in_thread(app) as (url, _loop):
        c = httpx.Client(base_url=url)
        page = c.get("/ui/models")
        assert page.status_code == 200 and 'name="console-role" content="admin"' in page.text
        assert c.get("/ui/api/models").status_code == 200
        assert c.get("/ui/nope").status_code == 404


def test_event_streams_are_bounded_per_browser_and_in_total() -> None:
    async def run() -> None:
        async def tick(_hub: Hub) -> None:
            return None

        hub = Hub(tick, max_streams={"viewer": 3, "admin": 3}, per_session=2, queue_size=2)
        a1, _a2 = hub.open("a", {"models"}), hub.open("a", {"models"})
        with pytest.raises(TooManyStreams, match="this browser"):
            hub.open("a", {"models"})
        hub.open("b", {"live"})
        with pytest.raises(TooManyStreams, match="live pages open"):
            hub.open("c", {"models"})
        for i in range(5):  # a page that does not read keeps only the newest events
            hub.publish("models", {"n": i})
        assert a1.queue.qsize() == 2 and a1.dropped == 3
        assert b"3" in a1.queue.get_nowait() and b"4" in a1.queue.get_nowait()
        await hub.stop()

    asyncio.run(run())


def test_the_sse_endpoint_answers_429_past_the_limit(keyed: str) -> None:
    c, _ = login(keyed, USER)
    streams = []
    try:
        for _ in range(6):  # the per-browser limit
            s = c.stream("GET", "/ui/api/events?topics=models")
            r = s.__enter__()
            streams.append(s)
            assert r.status_code == 200
        r = c.get("/ui/api/events?topics=models")
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_streams"
    finally:
        for s in streams:
            s.__exit__(None, None, None)


def test_a_stopping_gateway_ends_the_open_streams_at_once() -> None:
    """uvicorn's drain waits for every open response: a page's stream must end when SIGTERM comes (the handler
    stack.assemble puts in front of uvicorn's calls Hub.end_streams), not hold `vstack down` for drain_grace_s."""
    app = create_app(GatewayConfig(), default_model="m", environ={})
    with app_in_thread(app) as (url, _loop):
        c = httpx.Client(base_url=url, timeout=10)
        c.get("/ui/models")
        with c.stream("GET", "/ui/api/events?topics=models") as stream:
            lines = stream.iter_lines()
            assert next(lines) == "retry: 3000"
            t0 = time.monotonic()
            app.state.console.hub.end_streams()  # from another thread, as from a signal handler
            list(lines)  # returns only because the stream ended (else: a keep-alive in 15 s, a ReadTimeout at 10)
        assert time.monotonic() - t0 < 5 and app.state.console.hub.clients == set()


@pytest.fixture
def fresh():
    """A keyed gateway of its own: these tests fill its sessions, streams and login throttle."""
    settings = GatewayConfig.model_validate({"api_keys": [{"name": "team", "env": "K"}],
                                             "admin_key": {"name": "ops", "env": "A"}})  # fmt: skip
    app = create_app(settings, default_model="m", environ={"K": USER, "A": ADMIN})
    with app_in_thread(app) as (url, _loop):
        yield url, app.state.console


def test_viewer_logins_never_log_the_admin_out(fresh) -> None:
    """Issue 49, item 4: sessions were evicted oldest first at 256 whatever their role, so 257 logins with a
    client key logged the admin out. Each role now has its own budget."""
    url, console = fresh
    admin, _ = login(url, ADMIN)
    viewers = httpx.Client(base_url=url)  # one connection for all 257 logins (each still a session of its own)
    for _ in range(console.sessions.limits["viewer"] + 1):
        assert viewers.post("/ui/login", json={"key": USER}).status_code == 200
    assert admin.get("/ui/api/models").status_code == 200
    assert console.sessions.count("admin") == 1 and console.sessions.count("viewer") == 256


def test_viewer_streams_never_take_the_admins(fresh) -> None:
    """8 viewer logins x 8 event streams took all 32 streams and the admin got 429: now the viewers' budget
    runs out, the admin's does not."""
    url, console = fresh
    console.hub.max_streams = {"admin": 2, "viewer": 3}  # small, so the test opens few connections
    opened = []
    try:
        for _ in range(2):
            viewer, _ = login(url, USER)
            for _ in range(2):
                s = viewer.stream("GET", "/ui/api/events?topics=models")
                opened.append(s)
                r = s.__enter__()
                if len(opened) <= 3:
                    assert r.status_code == 200
                else:
                    assert r.status_code == 429 and "for the viewer role" in r.read().decode()
        admin, _ = login(url, ADMIN)
        s = admin.stream("GET", "/ui/api/events?topics=models")
        opened.append(s)
        assert s.__enter__().status_code == 200
    finally:
        for s in opened:
            s.__exit__(None, None, None)


def test_wrong_keys_are_throttled_per_client(fresh) -> None:
    url, _ = fresh
    for _ in range(10):
        assert httpx.post(f"{url}/ui/login", json={"key": "guess"}).status_code == 401
    r = httpx.post(f"{url}/ui/login", json={"key": "guess"})
    assert r.status_code == 429 and r.json()["error"]["code"] == "login_throttled"
    assert 1 <= int(r.headers["retry-after"]) <= 60 and "try again in" in r.json()["error"]["message"]
    assert httpx.post(f"{url}/ui/login", json={"key": ADMIN}).status_code == 429  # no guessing meanwhile


def test_the_throttle_counts_each_client_and_forgets_after_the_window() -> None:
    from stack.gateway.console.throttle import LoginThrottle

    t = LoginThrottle(limit=3, window_s=60)
    for i in range(3):
        t.failed("10.0.0.1", now=100 + i)
    assert t.wait_s("10.0.0.1", now=103) == 57 and t.wait_s("10.0.0.2", now=103) == 0
    assert t.wait_s("10.0.0.1", now=160.5) == 0  # the first failure aged out


def test_the_cookie_is_secure_over_tls_only() -> None:
    from fastapi.testclient import TestClient

    settings = GatewayConfig.model_validate({"admin_key": {"name": "ops", "env": "A"}})
    app = create_app(settings, default_model="m", environ={"A": ADMIN})
    for base, secure in (("https://127.0.0.1:8443", True), ("http://127.0.0.1:8000", False)):
        with TestClient(app, base_url=base) as c:
            cookie = c.post("/ui/login", json={"key": ADMIN}).headers["set-cookie"]
            assert ("; Secure" in cookie or "; secure" in cookie) is secure, cookie


def test_the_playground_refuses_what_v1_refuses(keyed: str) -> None:
    c, csrf = login(keyed, USER)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10**9}
    r = c.post("/ui/api/chat", json=body, headers={"X-CSRF-Token": csrf})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens"
    assert "'max_completion_tokens' is too large: 1000000000" in r.json()["error"]["message"]


def test_the_keys_page_calls_are_the_admins_same_origin_and_csrf_checked(fresh) -> None:
    """The console's Keys page (adr/0043, adr/0039's rules): listing, adding and revoking named keys need the
    admin role; every change needs the CSRF token and a same-origin browser; the key is in the add's answer
    only; a revoked key's console sessions end with it."""
    url, _console = fresh
    viewer, vcsrf = login(url, USER)
    r = viewer.get("/ui/api/keys")
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_required" and "admin key" in r.text
    r = viewer.post("/ui/api/keys", json={"name": "carol"}, headers={"X-CSRF-Token": vcsrf})
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_required"
    admin, csrf = login(url, ADMIN)
    assert admin.get("/ui/api/keys").json() == {"keys": [], "revoked": []}
    spec = {"name": "carol", "role": "admin", "priority": "high", "limits": {"rpm": 5, "budget_usd": 2.5}}
    r = admin.post("/ui/api/keys", json=spec)
    assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed"
    r = admin.post("/ui/api/keys", json=spec, headers={"X-CSRF-Token": csrf, "Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "cross_site"
    assert admin.get("/ui/api/keys").json()["keys"] == []  # nothing added by the refused calls
    added = admin.post("/ui/api/keys", json=spec, headers={"X-CSRF-Token": csrf})
    assert added.status_code == 201, added.text
    key = added.json()["key"]
    assert key.startswith("vsk-") and "shown this once" in added.json()["note"]
    listed = admin.get("/ui/api/keys").json()["keys"]
    assert [(k["name"], k["role"], k["priority"], k["limits"]) for k in listed] == [
        ("carol", "admin", "high", {"rpm": 5, "budget_usd": 2.5})]  # fmt: skip
    assert key not in admin.get("/ui/api/keys").text and key not in admin.get("/ui/keys").text
    again = admin.post("/ui/api/keys", json={**spec, "replace": True}, headers={"X-CSRF-Token": csrf})
    assert again.status_code == 400 and "vstack keys add NAME --replace" in again.json()["error"]["message"]
    taken = admin.post("/ui/api/keys", json=spec, headers={"X-CSRF-Token": csrf})
    assert taken.status_code == 409 and taken.json()["error"]["code"] == "key_exists"
    # carol logs in with her key (an admin key: the admin role), then is revoked: her session ends with her key
    carol, _ = login(url, key)
    assert carol.get("/ui/api/keys").status_code == 200
    r = viewer.post("/ui/api/keys/carol/revoke", headers={"X-CSRF-Token": vcsrf})
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_required"
    r = admin.post("/ui/api/keys/carol/revoke", headers={"X-CSRF-Token": csrf})
    assert r.status_code == 200 and r.json()["revoked"] == "carol"
    assert carol.get("/ui/api/keys").status_code == 401
    assert httpx.post(f"{url}/ui/login", json={"key": key}).status_code == 401
    assert admin.get("/ui/api/keys").json() == {"keys": [], "revoked": ["carol"]}
    gone = admin.post("/ui/api/keys/nobody/revoke", headers={"X-CSRF-Token": csrf})
    assert gone.status_code == 404 and "vstack keys list" in gone.json()["error"]["message"]


def test_models_shows_each_replicas_kv_index_to_a_logged_in_session_only() -> None:
    """Issue 55: the Models page's data for a model with replicas: how they are picked (replica_routing) and
    what the gateway's KV index holds of each, behind the console's login like every /ui/api call."""
    with kv_console({"api_keys": [{"name": "team", "env": "K"}]}, environ={"K": USER}) as (url, _state):
        r = httpx.get(f"{url}/ui/api/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "console_login_required"
        assert "kv_events" not in r.text
        c, _ = login(url, USER)
        (m,) = c.get("/ui/api/models").json()["models"]
        assert m["model"] == "m" and m["replica_routing"] == "kv_events"
        assert m["replica_choices"] == {"kv_events": 1200, "balance": 3}  # by the caches; by the balance rule
        kv = {d["labels"]["replica"]: d["kv_events"] for d in m["deployments"]}
        assert kv["0"] == {"state": "live", "batches": 12, "replays": 1, "drops": 0, "blocks": 64, "block_size": 16,
                           "stored": 70, "removed": 6, "skipped": 0, "expected": 4}  # fmt: skip
        assert kv["0"]["blocks"] * kv["0"]["block_size"] == 1024  # the page's "64 blocks × 16 = 1,024 tokens"
        assert kv["1"]["state"] == "connecting" and kv["1"]["blocks"] == 0 and kv["1"]["block_size"] is None
        page = c.get("/ui/models").text  # the page loads models.js, which draws these figures
        assert "/ui/static/pages/models.js" in page
