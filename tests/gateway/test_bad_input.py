"""Bad input never reaches a 500: OpenAI's error JSON with the right 4xx. Keys required where set."""

from __future__ import annotations

import httpx
import pytest
from starlette.testclient import TestClient

from stack.config.sections.gateway import GatewayConfig, KeyRef
from stack.gateway.app import create_app
from stack.gateway.http.auth import hash_key

from .conftest import cloud_entry, local, run_gateway, start_mock, stop

MSG = [{"role": "user", "content": "hi"}]
KEY, ADMIN = "sk-client-key-000001", "sk-admin-key-000002"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory):
    mock = start_mock(tmp_path_factory.mktemp("engine"), "engine", "--chunks", "3")
    settings = GatewayConfig(
        api_keys=[KeyRef(name="team", sha256=hash_key(KEY)), KeyRef(name="ci", env="CI_KEY")],
        admin_key=KeyRef(name="admin", env="ADMIN_KEY"),
        max_body_bytes=64 * 1024,
        max_tokens_limit=4096,
    )
    env = {"CI_KEY": "sk-ci-key-000003", "ADMIN_KEY": ADMIN}
    with run_gateway(settings, default_model="smol", deployments=[local("e1", mock.url, "smol")], environ=env) as g:
        yield g
    stop(mock.proc)


def post(gw, body, key: str | None = KEY, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers, **kw)


def assert_error(r: httpx.Response, status: int, type_: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if type_:
        assert err["type"] == type_
    return err


@pytest.mark.parametrize(
    ("body", "param"),
    [  # what the gateway reads itself (the model it routes by, the stream flags, its token limit): refused first
        ({"messages": MSG}, "model"),
        ({"model": 42, "messages": MSG}, "model"),
        ({"model": "", "messages": MSG}, "model"),
        ({"model": "smol", "messages": MSG, "stream": "maybe"}, "stream"),
        ({"model": "smol", "messages": MSG, "stream_options": "usage"}, "stream_options"),
        ({"model": "smol", "messages": MSG, "max_tokens": 10**12}, "max_tokens"),
        ({"model": "smol", "messages": MSG, "max_completion_tokens": 5e9}, "max_completion_tokens"),
    ],
)
def test_invalid_bodies_are_400_naming_the_param(gw, body: dict, param: str) -> None:
    err = assert_error(post(gw, body), 400, "invalid_request_error")
    assert err["param"] == param


def test_the_other_fields_are_the_engines_to_check(gw) -> None:
    """A local engine checks every field the gateway does not read (vLLM's own answer: adr/0047); the stand-in
    engine here takes anything, so the body reached it as sent."""
    r = post(gw, {"model": "smol", "messages": MSG, "temperature": 9, "frobnicate": True, "top_k": -7})
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def cloud_gw(cloud_mock):
    mp = pytest.MonkeyPatch()
    mp.setenv("VSTACK_TEST_CLOUD_KEY", "sk-test-cloud-key-123456")
    try:
        with run_gateway(GatewayConfig(cloud=[cloud_entry(cloud_mock.url, "cloud-small")]),
                         default_model="cloud-small") as g:  # fmt: skip
            yield g
    finally:
        mp.undo()


@pytest.mark.parametrize(
    ("body", "param"),
    [  # a cloud deployment has no vLLM to check: the cloud client checks the API's own model (OpenAI's)
        ({"model": "smol", "messages": []}, "messages"),
        ({"model": "smol"}, "messages"),
        ({"model": "smol", "messages": "hello"}, "messages"),
        ({"model": "smol", "messages": [{"content": "no role"}]}, "messages.0.role"),
        ({"model": "smol", "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"model": "smol", "messages": MSG, "temperature": "hot"}, "temperature"),
        ({"model": "smol", "messages": MSG, "temperature": 9}, "temperature"),
        ({"model": "smol", "messages": MSG, "n": 0}, "n"),
        ({"model": "smol", "messages": MSG, "max_tokens": -1}, "max_tokens"),
        ({"model": "smol", "messages": MSG, "top_logprobs": 99}, "top_logprobs"),
        ({"model": "smol", "messages": MSG, "frobnicate": True}, "frobnicate"),
        ({"model": "smol", "messages": MSG, "response_format": {"type": "yaml"}}, "response_format"),
    ],
)
def test_a_cloud_deployment_checks_the_apis_own_model(cloud_gw, body: dict, param: str) -> None:
    body = {**body, "model": "cloud-small"}
    r = httpx.post(f"{cloud_gw.url}/v1/chat/completions", json=body, timeout=30)
    err = assert_error(r, 400, "invalid_request_error")
    assert err["param"] == param


def test_malformed_json_and_non_object_bodies(gw) -> None:
    h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    for raw in (b"{bad", b"[1,2]", b"", b"null", b"\xff\xfe"):
        assert_error(httpx.post(f"{gw.url}/v1/chat/completions", content=raw, headers=h), 400)


def test_unknown_model_is_404(gw) -> None:
    err = assert_error(post(gw, {"model": "gpt-17", "messages": MSG}), 404)
    assert err["code"] == "model_not_found"


def test_body_over_the_limit_is_413(gw) -> None:
    big = {"model": "smol", "messages": [{"role": "user", "content": "x" * 100_000}]}
    assert_error(post(gw, big), 413)
    chunked = (b"x" * 1024 for _ in range(100))  # no Content-Length: counted while reading
    h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    assert_error(httpx.post(f"{gw.url}/v1/chat/completions", content=chunked, headers=h), 413)


def test_unknown_route_and_method(gw) -> None:
    # Without a key an unknown /v1 path is 401 like the rest of /v1: its 404 text lists the endpoints (issue 34).
    assert_error(httpx.get(f"{gw.url}/v1/nope"), 401)
    assert_error(httpx.get(f"{gw.url}/v1/nope", headers={"Authorization": f"Bearer {KEY}"}), 404)
    assert_error(httpx.get(f"{gw.url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}), 405)


def test_keys_required_and_never_echoed(gw) -> None:
    err = assert_error(post(gw, {"model": "smol", "messages": MSG}, key=None), 401, "authentication_error")
    assert err["code"] == "missing_api_key"
    wrong = "sk-wrong-key-should-not-echo"
    r = post(gw, {"model": "smol", "messages": MSG}, key=wrong)
    assert_error(r, 401)
    assert wrong not in r.text
    assert post(gw, {"model": "smol", "messages": MSG}).status_code == 200
    assert post(gw, {"model": "smol", "messages": MSG}, key="sk-ci-key-000003").status_code == 200
    assert httpx.get(f"{gw.url}/v1/models", headers={"x-api-key": KEY}).status_code == 200


def test_admin_needs_the_admin_key_not_a_client_key(gw) -> None:
    assert_error(httpx.get(f"{gw.url}/admin/models"), 401)
    assert_error(httpx.get(f"{gw.url}/admin/models", headers={"Authorization": f"Bearer {KEY}"}), 401)
    r = httpx.get(f"{gw.url}/admin/models", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200
    assert ADMIN not in r.text and KEY not in r.text
    assert httpx.get(f"{gw.url}/health").status_code == 200  # probes need no key
    assert httpx.get(f"{gw.url}/ready").status_code in (200, 503)
    assert_error(httpx.get(f"{gw.url}/metrics"), 401)  # metrics follow the keys (issue 34): client or admin key
    for key in (KEY, ADMIN):
        assert httpx.get(f"{gw.url}/metrics", headers={"Authorization": f"Bearer {key}"}).status_code == 200


def test_admin_without_admin_key_is_loopback_only() -> None:
    app = create_app(GatewayConfig(), default_model="smol")
    # (the Host a client on this machine sends: TestClient's own `testserver` is not a name this gateway serves)
    with TestClient(app, client=("203.0.113.7", 5000), base_url="http://127.0.0.1:8000") as c:
        assert_error(c.get("/admin/models"), 403, "permission_error")
    with TestClient(app, client=("127.0.0.1", 5000), base_url="http://127.0.0.1:8000") as c:
        assert c.get("/admin/models").status_code == 200


def test_cors_is_off_unless_configured() -> None:
    pre = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    with TestClient(create_app(GatewayConfig(), default_model="smol")) as c:
        assert "access-control-allow-origin" not in c.options("/v1/chat/completions", headers=pre).headers
    app = create_app(GatewayConfig(cors_origins=["https://app.example"]), default_model="smol")
    with TestClient(app) as c:
        r = c.options("/v1/chat/completions", headers=pre)
        assert r.headers["access-control-allow-origin"] == "https://app.example"
