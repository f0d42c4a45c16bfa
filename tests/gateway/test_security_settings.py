"""Issue 34, items 4 and 5 at the gateway: what an admin can add at run time, what answers without a key.

- A runtime local deployment's api_base is loopback, gateway.internal_networks, or a host the gateway was set
  up with (before: any host, which /metrics/engines/<id> then fetched from without a key).
- A runtime deployment may not shadow an alias (`default` included) or an adapter, and a cloud deployment
  joins a locally served model only behind its engines (before: each accepted, taking that name's traffic).
- /metrics, /metrics/targets and /metrics/engines/<id> follow the keys (before: open); /metrics/targets
  names the socket the request came in on, not the Host header (before: echoed).
- An admin key whose value is a client key's is refused at start (before: the client key opened /admin).

The engine here is bench/harness/mock_upstream.py, the project's stand-in for an OpenAI-compatible server:
these tests look at the gateway's own decisions, not at what an engine answers.
"""

from __future__ import annotations

import httpx
import pytest

from stack.config.sections.gateway import GatewayConfig, KeyRef
from stack.errors import ConfigError
from stack.gateway.app import create_app
from stack.gateway.http.auth import hash_key

from .conftest import local, run_gateway, start_mock, stop

KEY, ADMIN, METRICS = "sk-client-key-100001", "sk-admin-key-100002", "sk-metrics-key-100003"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    mock = start_mock(tmp_path_factory.mktemp("engine"), "engine", "--chunks", "2")
    yield mock
    stop(mock.proc)


@pytest.fixture(scope="module")
def gw(engine):
    settings = GatewayConfig(
        api_keys=[KeyRef(name="team", sha256=hash_key(KEY))], admin_key=KeyRef(name="admin", env="ADMIN_KEY"),
        metrics_key=KeyRef(name="prometheus", env="METRICS_KEY"), aliases={"fast": "smol"},
        internal_networks=["10.0.0.0/8", "engine-b"],
    )  # fmt: skip
    with run_gateway(settings, default_model="smol", deployments=[local("e1", engine.url, "smol")],
                     environ={"ADMIN_KEY": ADMIN, "METRICS_KEY": METRICS}) as g:  # fmt: skip
        yield g


def _admin(gw, body: dict) -> httpx.Response:
    return httpx.post(f"{gw.url}/admin/deployments", json=body, headers={"Authorization": f"Bearer {ADMIN}"})


@pytest.mark.parametrize("base", ["http://169.254.169.254", "http://example.com:8000", "http://10.0.0.1.evil.com",
                                  "http://192.168.1.5:8000", "https://[2001:db8::1]:443"])  # fmt: skip
def test_a_runtime_local_deployment_may_not_point_outside(gw, base: str) -> None:
    r = _admin(gw, {"model_group": "other", "api_base": base})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "destination_not_allowed" and err["param"] == "api_base"
    assert not [d for d in gw.state.registry.all() if d.model_group == "other"]  # nothing half-registered


@pytest.mark.parametrize("base", ["http://10.1.2.3:8000", "http://engine-b:8000", "http://localhost:9"])
def test_loopback_and_internal_networks_are_allowed(gw, base: str) -> None:
    r = _admin(gw, {"model_group": "inside", "api_base": base, "id": f"in-{abs(hash(base))}"})
    assert r.status_code == 201, r.text
    assert r.json()["labels"] == {"added": "admin"}


def test_an_admin_added_host_does_not_become_internal(gw, engine) -> None:
    ok = _admin(gw, {"model_group": "inside", "api_base": "http://10.9.9.9:8000", "id": "ten"})
    assert ok.status_code == 201, ok.text
    assert _admin(gw, {"model_group": "inside", "api_base": "http://93.184.216.34:80"}).status_code == 400
    # the configured engine's own host stays allowed (127.0.0.1 here)
    assert _admin(gw, {"model_group": "smol", "api_base": engine.url, "id": "again"}).status_code == 201


@pytest.mark.parametrize(("body", "said"), [
    ({"model_group": "default", "api_base": "http://127.0.0.1:9"}, "is an alias"),
    ({"model_group": "fast", "api_base": "http://127.0.0.1:9"}, "is an alias"),
    ({"model_group": "smol", "kind": "cloud", "order": 1,
      "cloud": {"model_name": "smol", "litellm_params": {"model": "openai/gpt-4o-mini"}}}, "may only follow it"),
])  # fmt: skip
def test_a_runtime_deployment_may_not_shadow_a_name(gw, body: dict, said: str) -> None:
    r = _admin(gw, body)
    assert r.status_code == 400 and said in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("path", ["/metrics", "/metrics/targets", "/metrics/engines/e1"])
def test_metrics_follow_the_keys(gw, path: str) -> None:
    assert httpx.get(f"{gw.url}{path}").status_code == 401
    assert httpx.get(f"{gw.url}{path}", headers={"Authorization": "Bearer wrong"}).status_code == 401
    for key in (METRICS, KEY, ADMIN):
        r = httpx.get(f"{gw.url}{path}", headers={"Authorization": f"Bearer {key}"})
        # past the key check; the stand-in engine may serve no /metrics of its own (its status is passed on)
        assert r.status_code == 200 or (path.startswith("/metrics/engines") and r.status_code != 401), r.text
    assert httpx.get(f"{gw.url}/health").status_code == 200


def test_metrics_targets_do_not_echo_the_host_header(gw) -> None:
    r = httpx.get(f"{gw.url}/metrics/targets", headers={"Authorization": f"Bearer {METRICS}", "Host": "evil.example:1"})
    assert r.status_code == 200 and r.json(), r.text
    assert "evil" not in r.text
    assert r.json()[0]["targets"] == [gw.url.removeprefix("http://")]


def test_unknown_v1_paths_need_a_key_before_listing_endpoints(gw) -> None:
    r = httpx.get(f"{gw.url}/v1/secret-path")
    assert r.status_code == 401 and "/v1/chat/completions" not in r.text
    assert httpx.get(f"{gw.url}/v1/secret-path", headers={"Authorization": f"Bearer {KEY}"}).status_code == 404


def test_an_admin_key_equal_to_a_client_key_is_refused() -> None:
    settings = GatewayConfig(api_keys=[KeyRef(name="team", env="TEAM_KEY")], admin_key=KeyRef(name="admin", env="ADM"))
    with pytest.raises(ConfigError, match=r"admin_key 'admin' has the same value as gateway\.api_keys 'team'"):
        create_app(settings, default_model="smol", environ={"TEAM_KEY": "same-value", "ADM": "same-value"})
    with pytest.raises(ValueError, match="are the same key"):
        GatewayConfig(api_keys=[KeyRef(name="a", sha256=hash_key("k"))], admin_key=KeyRef(sha256=hash_key("k")))


def test_metrics_keep_no_series_of_what_was_removed(gw) -> None:
    """Names come and go at run time (deployments, adapters): /metrics lists what exists now, so a stream of
    added-and-removed names cannot grow it without bound (before: every name stayed)."""
    auth = {"Authorization": f"Bearer {ADMIN}"}
    assert _admin(gw, {"model_group": "smol", "api_base": "http://127.0.0.1:9", "id": "passing-by"}).status_code == 201
    assert 'deployment="passing-by"' in httpx.get(f"{gw.url}/metrics", headers=auth).text
    assert httpx.delete(f"{gw.url}/admin/deployments/passing-by", headers=auth).status_code == 200
    assert 'deployment="passing-by"' not in httpx.get(f"{gw.url}/metrics", headers=auth).text
    book = gw.state.adapters
    book.metrics.requests.labels("tried-once", "smol").inc()
    book.metrics.forget("tried-once", "smol")  # what DELETE /admin/adapters/<name> does
    assert "tried-once" not in httpx.get(f"{gw.url}/metrics", headers=auth).text
