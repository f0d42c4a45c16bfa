"""Named keys (tenants), their limits and the fair admission queue, against the real gateway (adr/0043).

Each gateway runs in a thread of this process in front of the paced stand-in engine (bench/harness/
paced_engine.py: `slots` sequences at once, a token every `token_ms`, the others in its own queue), whose
/stats says in which order requests got a sequence; that order is what fair admission is about. The cloud is
the mock provider reached through LiteLLM (tests/gateway/conftest.py).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.gateway_thread import app_in_thread
from bench.harness.paced_engine import PacedEngine, serving
from bench.harness.waiting import wait_for
from stack.config.sections.gateway import GatewayConfig
from stack.gateway.registry import Deployment

from .conftest import cloud_entry, run_gateway

MODEL = "smol"
KEYS = {"alice": "alice-key-0001", "bob": "bob-key-0002", "victor": "victor-key-0003", "admin": "admin-key-0004"}


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def tenant(name: str, **extra) -> dict:
    return {"name": name, "sha256": sha(KEYS[name]), **extra}


def engine_dep(url: str, **labels: str) -> Deployment:
    return Deployment(id="engine", model_group=MODEL, kind="local", upstream_model=MODEL, api_base=url,
                      labels=dict(labels))  # fmt: skip


def ask(url: str, who: str | None, *, tokens: int = 4, user: str = "-", stream: bool = False, model: str = MODEL,
        content: str = "x" * 40, timeout: float = 30, **extra) -> httpx.Response:  # fmt: skip
    headers = {"Authorization": f"Bearer {KEYS.get(who, who)}"} if who else {}
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": tokens,
            "user": user, "stream": stream, **extra}  # fmt: skip
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=timeout)


def started(engine_url: str) -> list[dict]:
    return httpx.get(f"{engine_url}/stats").json()["started"]


def settings(*tenants: dict, **gateway) -> GatewayConfig:
    return GatewayConfig(tenants=list(tenants), liveness={"enabled": False}, spill={"enabled": False}, **gateway)


def test_named_keys_open_v1_by_role_and_the_existing_keys_still_work() -> None:
    cfg = settings(tenant("alice"), tenant("victor", role="viewer"), tenant("bob", models=["other-model"]),
                   api_keys=[{"name": "legacy", "env": "LEGACY_KEY"}])  # fmt: skip
    with serving(PacedEngine(2, 1)) as eng, run_gateway(cfg, default_model=MODEL, deployments=[engine_dep(eng)],
                                                        environ={"LEGACY_KEY": "legacy-0005"}) as gw:  # fmt: skip
        assert ask(gw.url, None).status_code == 401
        wrong = ask(gw.url, "not-a-key")
        assert wrong.status_code == 401 and "not-a-key" not in wrong.text
        viewer = ask(gw.url, "victor")
        assert viewer.status_code == 403 and viewer.json()["error"]["code"] == "viewer_key"
        assert "console" in viewer.json()["error"]["message"]
        assert ask(gw.url, "alice").status_code == 200
        assert ask(gw.url, "legacy-0005").status_code == 200  # gateway.api_keys as before
        refused = ask(gw.url, "bob")
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "model_not_allowed"
        assert "vstack keys add bob --replace" in refused.json()["error"]["message"]
        # /metrics: any named key reads it, and named keys alone do not leave it open
        assert httpx.get(f"{gw.url}/metrics").status_code == 401
        assert httpx.get(f"{gw.url}/metrics", headers={"Authorization": f"Bearer {KEYS['victor']}"}).status_code == 200


def test_each_limit_answers_429_with_its_name_and_retry_after() -> None:
    cfg = settings(
        tenant("alice", limits={"rpm": 2}),
        tenant("bob", limits={"tpm": 100}),
        tenant("victor", limits={"token_budget": 50}),
        tenant("admin", limits={"concurrent": 1}),
    )
    with serving(PacedEngine(4, 10)) as eng, run_gateway(cfg, default_model=MODEL,
                                                         deployments=[engine_dep(eng)]) as gw:  # fmt: skip
        # rpm: the third request of the minute
        assert [ask(gw.url, "alice").status_code for _ in range(2)] == [200, 200]
        over = ask(gw.url, "alice")
        err = over.json()["error"]
        assert over.status_code == 429 and err["code"] == "rpm_exceeded" and err["type"] == "rate_limit_error"
        assert over.headers["x-vstack-limit"] == "rpm" and 55 <= int(over.headers["Retry-After"]) <= 60
        assert "2 requests per minute" in err["message"]
        # tpm: 40 characters (10 tokens) + max_tokens 30 = 40 tokens a request: two fit in 100, a third does not
        assert [ask(gw.url, "bob", tokens=30).status_code for _ in range(2)] == [200, 200]
        over = ask(gw.url, "bob", tokens=30)
        assert over.status_code == 429 and over.json()["error"]["code"] == "tpm_exceeded"
        assert "80 used or reserved, this request counts 40" in over.json()["error"]["message"]
        assert ask(gw.url, "bob", tokens=10).status_code == 200  # 20 more still fit: the window is exact
        # a request larger than the whole tpm can never pass: said so, and no Retry-After
        huge = ask(gw.url, "bob", tokens=500)
        assert huge.status_code == 429 and "Retry-After" not in huge.headers and "lower max_tokens" in huge.text
        # token budget: spent, no Retry-After (waiting does not help)
        assert ask(gw.url, "victor", tokens=30).status_code == 200
        spent = ask(gw.url, "victor", tokens=30)
        assert spent.status_code == 429 and spent.json()["error"]["code"] == "token_budget_exceeded"
        assert "Retry-After" not in spent.headers
        # concurrent: a second request while the first runs (held by the engine until released)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(ask, gw.url, "admin", user="hold")
            running(eng, 1)
            second = ask(gw.url, "admin")
            httpx.post(f"{eng}/release")
            assert first.result().status_code == 200
        assert second.status_code == 429 and second.json()["error"]["code"] == "concurrent_exceeded"
        assert second.headers["Retry-After"] == "1"
        # the engine never saw a refused request
        assert len(started(eng)) == 2 + 3 + 1 + 1


def test_a_key_over_its_limit_spills_to_the_cloud_when_it_may(cloud_mock, monkeypatch) -> None:
    monkeypatch.setenv("VSTACK_TEST_CLOUD_KEY", "sk-test-cloud-key-123456")
    cfg = settings(tenant("alice", spill=True, limits={"rpm": 1}), tenant("bob", limits={"rpm": 1}),
                   cloud=[cloud_entry(cloud_mock.url)], fallbacks={MODEL: ["cloud-small"]})  # fmt: skip
    with serving(PacedEngine(2, 1)) as eng, run_gateway(cfg, default_model=MODEL,
                                                        deployments=[engine_dep(eng)]) as gw:  # fmt: skip
        assert ask(gw.url, "alice").headers["x-vstack-deployment"] == "engine"
        spilled = ask(gw.url, "alice")
        assert spilled.status_code == 200 and spilled.headers["x-vstack-fallback"] == "quota"
        assert spilled.headers["x-vstack-deployment"].startswith("cloud-")
        assert ask(gw.url, "bob").status_code == 200
        assert ask(gw.url, "bob").status_code == 429  # bob's key does not allow the spill
        usage = {(r["tenant"], r["model"]): r for r in gw.state.dispatcher.tenants.usage.table()}
        assert usage[("alice", MODEL)]["spilled"] == 1 and usage[("alice", MODEL)]["requests"] == 2
        assert usage[("bob", MODEL)]["refused"] == 1
        route = [r["route"] for r in gw.state.dispatcher.activity.last() if r["tenant"] == "alice"]
        assert route[0] == "spilled:quota"


def admission(**extra) -> dict:
    return {"enabled": True, "max_in_engine": 1, **extra}


def flood(url: str, who: str, n: int, user: str, pool, **kw) -> list:
    return [pool.submit(ask, url, who, user=f"{user}{i}", **kw) for i in range(n)]


def waiting(gw, n: int) -> None:
    """Until `n` requests wait in the gateway's admission queue (what the test arranged has arrived)."""
    queue = gw.state.dispatcher.tenants.admission.queue(MODEL)
    wait_for(lambda: queue.waiting() == n, 30, f"{n} requests waiting")


def running(eng: str, n: int) -> None:
    wait_for(lambda: httpx.get(f"{eng}/stats").json()["running"] == n, 30, f"{n} running in the engine")


def test_admission_orders_by_class_then_fairly_between_tenants() -> None:
    cfg = settings(tenant("alice", priority="low"), tenant("bob", priority="low"), tenant("victor", priority="high"),
                   admission=admission())  # fmt: skip
    with serving(PacedEngine(4, 1)) as eng, run_gateway(cfg, default_model=MODEL,
                                                        deployments=[engine_dep(eng)]) as gw:  # fmt: skip
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futures = flood(gw.url, "alice", 1, "hold", pool)  # alice's first holds the one place
            running(eng, 1)
            futures += flood(gw.url, "alice", 5, "a", pool)  # alice floods: five wait
            waiting(gw, 5)
            futures += flood(gw.url, "bob", 2, "b", pool)  # bob, same class, comes later
            waiting(gw, 7)
            futures += flood(gw.url, "victor", 1, "v", pool)  # victor, high class, last
            waiting(gw, 8)
            httpx.post(f"{eng}/release")
            assert all(f.result().status_code == 200 for f in futures)
        order = [s["user"][0] for s in started(eng)][1:]
        # victor goes first of those waiting; bob's two are interleaved with alice's queue, not behind all of it
        assert order[0] == "v" and order[1:5].count("b") == 2, order
        assert httpx.get(f"{eng}/stats").json()["max_running"] == 1  # the engine never held two at once


def test_fifo_without_admission_lets_a_flood_go_first() -> None:
    """The same arrivals with admission off (today's default): the engine's own queue, first come first served."""
    cfg = settings(tenant("alice"), tenant("bob"))
    with serving(PacedEngine(1, 1)) as eng, run_gateway(cfg, default_model=MODEL,
                                                        deployments=[engine_dep(eng)]) as gw:  # fmt: skip
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futures = flood(gw.url, "alice", 1, "hold", pool)
            running(eng, 1)
            futures += flood(gw.url, "alice", 4, "a", pool)
            wait_for(lambda: httpx.get(f"{eng}/stats").json()["waiting"] == 4, 30, "4 waiting in the engine")
            futures += flood(gw.url, "bob", 1, "b", pool)
            wait_for(lambda: httpx.get(f"{eng}/stats").json()["waiting"] == 5, 30, "5 waiting in the engine")
            httpx.post(f"{eng}/release")
            assert all(f.result().status_code == 200 for f in futures)
        assert [s["user"][0] for s in started(eng)] == ["h"] + ["a"] * 4 + ["b"]


def test_the_reserve_keeps_a_place_for_a_tenant_with_nothing_in_the_engine() -> None:
    cfg = settings(tenant("alice"), tenant("bob"), admission=admission(max_in_engine=3, reserve=1))
    engine = PacedEngine(8, 1)
    pool = concurrent.futures.ThreadPoolExecutor(16)
    with serving(engine) as eng, run_gateway(cfg, default_model=MODEL, deployments=[engine_dep(eng)]) as gw, pool:
        futures = flood(gw.url, "alice", 6, "hold", pool)  # never end until released
        waiting(gw, 4)
        assert httpx.get(f"{eng}/stats").json()["running"] == 2  # alice fills max_in_engine - reserve
        # bob is answered while every one of alice's requests still runs or waits: he waited for none of them
        assert ask(gw.url, "bob", user="b").status_code == 200
        assert [s["user"][0] for s in started(eng)] == ["h", "h", "b"]
        httpx.post(f"{eng}/release")
        assert all(f.result().status_code == 200 for f in futures)


def test_a_tenants_queue_is_bounded_and_a_wait_times_out() -> None:
    cfg = settings(tenant("alice"), tenant("bob"),
                   admission=admission(max_queued_per_tenant=2, queue_timeout_s=3))  # fmt: skip
    with serving(PacedEngine(1, 1)) as eng, run_gateway(cfg, default_model=MODEL,
                                                        deployments=[engine_dep(eng)]) as gw:  # fmt: skip
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = flood(gw.url, "alice", 1, "hold", pool)  # holds the place
            running(eng, 1)
            futures += flood(gw.url, "alice", 2, "a", pool)  # 2 wait
            waiting(gw, 2)
            full = ask(gw.url, "alice")
            late = [f.result() for f in futures[1:]]
            httpx.post(f"{eng}/release")
            assert futures[0].result().status_code == 200
        assert full.status_code == 429 and full.json()["error"]["code"] == "queue_exceeded"
        assert "max_queued_per_tenant" in full.json()["error"]["message"]
        # the two waiting gave up after queue_timeout_s, with 429, Retry-After and the setting named
        assert [r.json()["error"]["code"] for r in late] == ["queue_timeout_exceeded"] * 2
        assert all(r.headers["Retry-After"] == "5" and "queue_timeout_s" in r.text for r in late)
        row = gw.state.dispatcher.tenants.usage.table("alice")[0]
        assert (row["requests"], row["refused"], row["errors"]) == (1, 3, 0)  # refusals, not errors


def test_the_class_is_handed_to_an_engine_that_schedules_by_priority() -> None:
    cfg = settings(tenant("alice", priority="high"), tenant("bob", priority="low"))
    with serving(PacedEngine(2, 1, policy="priority")) as prio, serving(PacedEngine(2, 1)) as fcfs:
        deps = [
            engine_dep(prio, scheduling="priority"),
            Deployment(id="plain", model_group="plain", kind="local", upstream_model="plain", api_base=fcfs),
        ]
        with run_gateway(cfg, default_model=MODEL, deployments=deps) as gw:
            assert ask(gw.url, "alice", user="a").status_code == 200
            # a client's own `priority` is replaced by its key's class: nobody jumps the queue by asking
            assert ask(gw.url, "bob", user="b", priority=-100).status_code == 200
            assert [(s["user"], s["priority"]) for s in started(prio)] == [("a", -1), ("b", 1)]
            assert ask(gw.url, "alice", user="p", model="plain").status_code == 200  # nothing sent to a FCFS engine
            assert started(fcfs)[0]["priority"] == 0


def test_usage_in_metrics_activity_and_export() -> None:
    cfg = settings(tenant("alice"), tenant("bob", limits={"rpm": 1}), api_keys=[{"name": "legacy", "env": "LK"}])
    with serving(PacedEngine(2, 1)) as eng, run_gateway(cfg, default_model=MODEL, deployments=[engine_dep(eng)],
                                                        environ={"LK": "legacy-0005"}) as gw:  # fmt: skip
        assert ask(gw.url, "alice", tokens=5, stream=True).status_code == 200
        assert ask(gw.url, "alice", tokens=7).status_code == 200
        assert ask(gw.url, "bob").status_code == 200
        assert ask(gw.url, "bob").status_code == 429
        assert ask(gw.url, "legacy-0005", tokens=3).status_code == 200
        text = httpx.get(f"{gw.url}/metrics", headers={"Authorization": "Bearer legacy-0005"}).text
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip

        def value(name: str, **labels: str) -> float:
            return samples.get((name, tuple(sorted(labels.items()))), 0.0)

        assert value("vstack_gateway_tenant_tokens_total", tenant="alice", model=MODEL, direction="completion") == 12
        assert value("vstack_gateway_tenant_tokens_total", tenant="alice", model=MODEL, direction="prompt") == 20
        assert value("vstack_gateway_tenant_requests_total", tenant="bob", model=MODEL, outcome="refused") == 1
        assert value("vstack_gateway_tenant_requests_total", tenant="other", model=MODEL, outcome="ok") == 1
        assert not any("legacy" in str(k) for k in samples if k[0].startswith("vstack_gateway_tenant"))
        tenants = [r["tenant"] for r in gw.state.dispatcher.activity.last()]
        assert tenants == ["", "bob", "bob", "alice", "alice"]
        csv = httpx.get(f"{gw.url}/admin/usage", params={"format": "csv"}).text.splitlines()
        assert csv[0] == "tenant,model,requests,errors,refused,spilled,tokens_in,tokens_out,cost_usd"
        assert f"alice,{MODEL},2,0,0,0,20,12,0.0" in csv and f"bob,{MODEL},1,0,1,0,10,4,0.0" in csv
        series = httpx.get(f"{gw.url}/admin/usage").json()["per_minute"]
        assert sum(series["tenants"]["alice"]) == 32 and len(series["t"]) == 60


def test_keys_added_at_run_time_are_kept_hashed_and_survive_a_restart(tmp_path) -> None:
    from stack.gateway.app import create_app
    from stack.gateway.registry import DeploymentRegistry

    state_file = tmp_path / "runtime.json"
    cfg = settings(tenant("alice"), api_keys=[{"name": "legacy", "env": "LK"}])

    def gateway(eng: str):
        registry = DeploymentRegistry()
        registry.add(engine_dep(eng))
        return app_in_thread(create_app(cfg, default_model=MODEL, registry=registry, environ={"LK": "legacy-0005"},
                                        state_file=state_file))  # fmt: skip

    with serving(PacedEngine(2, 1)) as eng:
        with gateway(eng) as (url, _):
            added = httpx.post(f"{url}/admin/keys", json={"name": "carol", "priority": "high", "limits": {"rpm": 5}})
            assert added.status_code == 201, added.text
            key = added.json()["key"]
            assert key.startswith("vsk-") and len(key) > 40
            assert ask(url, key).status_code == 200
            listed = httpx.get(f"{url}/admin/keys").json()["keys"]
            assert [k["name"] for k in listed] == ["alice", "carol"] and key not in json.dumps(listed)
            assert sha(key) not in json.dumps(listed)
            again = httpx.post(f"{url}/admin/keys", json={"name": "carol"})
            assert again.status_code == 409 and "--replace" in again.json()["error"]["message"]
            legacy = httpx.post(f"{url}/admin/keys", json={"name": "x", "sha256": sha("legacy-0005")})
            assert legacy.status_code == 409 and legacy.json()["error"]["code"] == "key_taken"
            bad = httpx.post(f"{url}/admin/keys", content=b'{"name": "ok", "models": ["\\ud800"]}',
                             headers={"Content-Type": "application/json"})  # fmt: skip
            assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_text"
            assert httpx.delete(f"{url}/admin/keys/alice").status_code == 200  # a configured key, revoked
            assert ask(url, "alice").status_code == 401
        kept = state_file.read_text()
        assert key not in kept and sha(key) in kept and '"revoked": true' in kept
        with gateway(eng) as (url, _):  # the next start: carol still opens /v1, alice stays revoked
            assert ask(url, key).status_code == 200
            assert ask(url, "alice").status_code == 401
            assert httpx.delete(f"{url}/admin/keys/carol").status_code == 200
            assert ask(url, key).status_code == 401
            # the last named key revoked: /v1 still asks for a key (revoking a leaked key never opens it)
            assert ask(url, None).json()["error"]["code"] == "missing_api_key"


def test_an_admin_key_opens_admin_and_a_client_key_does_not() -> None:
    cfg = settings(tenant("admin", role="admin"), tenant("alice"), admin_key={"name": "root", "env": "AK"})
    with serving(PacedEngine(2, 1)) as eng, run_gateway(cfg, default_model=MODEL, deployments=[engine_dep(eng)],
                                                        environ={"AK": "root-0006"}) as gw:  # fmt: skip

        def keys(who: str) -> int:
            auth = {"Authorization": f"Bearer {KEYS.get(who, who)}"}
            return httpx.get(f"{gw.url}/admin/keys", headers=auth).status_code

        assert keys("admin") == 200 and keys("root-0006") == 200
        assert keys("alice") == 401
        assert ask(gw.url, "admin").status_code == 200  # an admin key also calls /v1


def test_a_config_whose_named_key_is_the_admin_key_is_refused() -> None:
    with pytest.raises(ValueError, match="same key as admin_key"):
        GatewayConfig(admin_key={"name": "root", "sha256": sha("x")}, tenants=[{"name": "a", "sha256": sha("x")}])
    with pytest.raises(ValueError, match="is taken"):
        GatewayConfig(tenants=[tenant("alice"), {"name": "alice", "sha256": sha("y")}])
    with pytest.raises(ValueError, match="never written in a config"):
        GatewayConfig(tenants=[{"name": "a"}])


def test_the_console_usage_page_shows_a_client_key_its_own_rows_and_a_viewer_key_all() -> None:
    cfg = settings(tenant("alice"), tenant("bob"), tenant("victor", role="viewer"))
    with serving(PacedEngine(2, 1)) as eng, run_gateway(cfg, default_model=MODEL,
                                                        deployments=[engine_dep(eng)]) as gw:  # fmt: skip
        assert ask(gw.url, "alice", tokens=5).status_code == 200
        assert ask(gw.url, "bob", tokens=6).status_code == 200

        def console(who: str) -> httpx.Client:
            c = httpx.Client(base_url=gw.url)
            login = c.post("/ui/login", json={"key": KEYS[who]})
            assert login.status_code == 200 and login.json()["role"] == "viewer", login.text
            return c

        with contextlib.closing(console("alice")) as c:
            page = c.get("/ui/usage")
            assert page.status_code == 200 and "/ui/static/pages/usage.js" in page.text
            assert "script-src 'self'" in page.headers["content-security-policy"]
            assert [r["tenant"] for r in c.get("/ui/api/usage").json()["usage"]] == ["alice"]
            assert c.get("/ui/api/usage", params={"format": "csv"}).text.splitlines()[1].startswith("alice,")
            assert c.get("/ui/static/pages/usage.js").status_code == 200
        with contextlib.closing(console("victor")) as c:
            rows = c.get("/ui/api/usage").json()
            assert [(r["tenant"], r["tokens_out"]) for r in rows["usage"]] == [("alice", 5), ("bob", 6)]
            assert sum(rows["per_minute"]["tenants"]["bob"]) == 16


def test_a_token_budget_counts_across_restarts(tmp_path) -> None:
    from stack.gateway.app import create_app
    from stack.gateway.registry import DeploymentRegistry

    cfg = settings(tenant("alice", limits={"token_budget": 60}))

    def gateway(eng: str):
        registry = DeploymentRegistry()
        registry.add(engine_dep(eng))
        return app_in_thread(create_app(cfg, default_model=MODEL, registry=registry, environ={},
                                        state_file=tmp_path / "runtime.json"))  # fmt: skip

    with serving(PacedEngine(2, 1)) as eng:
        with gateway(eng) as (url, _):
            assert ask(url, "alice", tokens=30).status_code == 200  # 10 + 30 = 40 of 60
        assert json.loads((tmp_path / "usage.json").read_text())["tenants"]["alice"]["total_tokens"] == 40
        with gateway(eng) as (url, _):
            spent = ask(url, "alice", tokens=30)
            assert spent.status_code == 429 and spent.json()["error"]["code"] == "token_budget_exceeded"
            assert "used 40 of its token budget of 60" in spent.json()["error"]["message"]


def priced_cloud(url: str) -> dict:
    """A FAKE cloud: the stand-in provider (bench/harness/mock_upstream.py, the `cloud_mock` fixture) reached
    through LiteLLM's OpenAI provider under a model name LiteLLM's price table knows (openai/gpt-4o). The
    answers (5 prompt tokens, one completion token per max_tokens) are the stand-in's; the prices are
    LiteLLM's own table's, as on a real cloud deployment."""
    return {**cloud_entry(url, group="cloud-priced"), "litellm_params": {"model": "openai/gpt-4o",
                                                                         "api_base": f"{url}/v1"}}  # fmt: skip


def test_a_money_budget_counts_cloud_answers_at_litellms_prices_then_refuses(cloud_mock, monkeypatch) -> None:
    from stack.gateway.upstreams.cloud_client import quiet_litellm

    quiet_litellm()  # offline: LiteLLM's own copy of its price table, as the gateway reads it
    import litellm

    price = litellm.model_cost["gpt-4o"]
    one = 5 * price["input_cost_per_token"] + 8 * price["output_cost_per_token"]  # one stand-in answer, 8 tokens
    monkeypatch.setenv("VSTACK_TEST_CLOUD_KEY", "sk-test-cloud-key-123456")
    cfg = settings(tenant("alice", spill=True, limits={"rpm": 1, "budget_usd": 1.5 * one}),
                   tenant("bob", limits={"budget_usd": 2.5 * one}),
                   cloud=[priced_cloud(cloud_mock.url)], fallbacks={MODEL: ["cloud-priced"]})  # fmt: skip
    with serving(PacedEngine(2, 1)) as eng, run_gateway(cfg, default_model=MODEL,
                                                        deployments=[engine_dep(eng)]) as gw:  # fmt: skip
        meters = gw.state.dispatcher.tenants.limiter.meters
        # alice: her first request on the local engine costs nothing; over her rpm she spills to the cloud,
        # streamed (its usage asked of the provider by the gateway, so a stream cannot escape the budget)
        assert ask(gw.url, "alice", tokens=8).headers["x-vstack-deployment"] == "engine"
        assert meters["alice"].cost_usd == 0
        spilled = ask(gw.url, "alice", tokens=8, stream=True)
        assert spilled.status_code == 200 and spilled.headers["x-vstack-fallback"] == "quota"
        assert '"usage"' not in spilled.text  # the client did not ask for usage: it gets none
        # a stream is counted just after its last bytes reach the client
        wait_for(lambda: meters["alice"].cost_usd > 0, 10, "the stream's cost counted")
        assert meters["alice"].cost_usd == pytest.approx(one)
        spilled = ask(gw.url, "alice", tokens=8)
        assert spilled.status_code == 200 and spilled.headers["x-vstack-fallback"] == "quota"
        assert meters["alice"].cost_usd == pytest.approx(2 * one)
        # spent: refused in OpenAI's error shape naming the limit, not spilled, no Retry-After (waiting won't help)
        spent = ask(gw.url, "alice", tokens=8)
        err = spent.json()["error"]
        assert spent.status_code == 429 and err["code"] == "budget_usd_exceeded" and err["param"] == "budget_usd"
        assert err["type"] == "rate_limit_error" and spent.headers["x-vstack-limit"] == "budget_usd"
        assert "Retry-After" not in spent.headers and "retry-after-ms" not in spent.headers
        assert f"budget of ${1.5 * one:g} (${2 * one:.4f})" in err["message"]
        assert "vstack keys add alice --replace" in err["message"]
        # bob asks the cloud model itself: three answers fit in 2.5 answers' money, a fourth does not
        assert [ask(gw.url, "bob", tokens=8, model="cloud-priced").status_code for _ in range(3)] == [200] * 3
        assert ask(gw.url, "bob", tokens=8, model="cloud-priced").json()["error"]["code"] == "budget_usd_exceeded"
        assert ask(gw.url, "bob", tokens=8).status_code == 429  # the local model too: the key is spent
        rows = {r["tenant"]: r for r in gw.state.dispatcher.tenants.usage.table()}
        assert rows["alice"]["cost_usd"] == pytest.approx(2 * one, abs=1e-6)
        csv = httpx.get(f"{gw.url}/admin/usage", params={"format": "csv"}).text
        # the export: alice 3 answered (2 spilled, priced), 1 refused; bob 3 answered on the cloud, 1 refused
        assert f"alice,{MODEL},3,0,1,2,20,24,{round(2 * one, 6)}" in csv.splitlines()
        assert f"bob,cloud-priced,3,0,1,0,15,24,{round(3 * one, 6)}" in csv.splitlines()
