"""The real ModelManager choosing tiers and the switch order, with stand-in engines on a fake GPU (the NVML
probe reads what they hold): overlap allowed and refused, the fallbacks from an overlapped switch (a sleep
that frees nothing, a wake that fails), level 2 with its weight reload, the tier shown in the status."""

from __future__ import annotations

import asyncio
import time

import pytest

from stack.config.sections.manager import ManagerConfig
from stack.manager.manager import ModelManager
from stack.manager.policy import Capacity
from stack.manager.slot import Slot
from stack.manager.states import ModelState

from .conftest import GIB, FakeGpu, StandIn, run

pytestmark = pytest.mark.solo  # an overlapped switch's seconds: nothing runs beside it (tests/conftest.py)

S = ModelState


def gpu_manager(engines: list[StandIn], gpu: FakeGpu, capacity_gib: float = 80, host_gib: float | None = None,
                **settings) -> ModelManager:  # fmt: skip
    slots = [Slot(e.spec.name, e, need=e.need, can_sleep=True, weights_gpu=e.weights, weights_host=e.weights)
             for e in engines]  # fmt: skip
    cfg = ManagerConfig(min_residency_s=0, quiet_s=0, queue_timeout_s=10, **settings)
    host = None if host_gib is None else int(host_gib * GIB)
    return ModelManager(slots, cfg, Capacity(int(capacity_gib * GIB), True, host), probe=gpu)


def pair(need_gib: float, weights_gib: float = 15) -> tuple[FakeGpu, StandIn, StandIn]:
    gpu = FakeGpu()
    a, b = StandIn("a", need=int(need_gib * GIB), gpu=gpu), StandIn("b", need=int(need_gib * GIB), gpu=gpu)
    for e in (a, b):
        e.weights = int(weights_gib * GIB)
        e.sleep_s = e.wake_s = 0.3
    return gpu, a, b


async def serve(manager: ModelManager, name: str) -> None:
    (await manager.admit(name)).release()


def call(engine: StandIn, what: str) -> tuple[float, float]:
    return next((t0, t1) for w, t0, t1 in reversed(engine.calls) if w == what)


def a_asleep_b_awake(mgr: ModelManager):
    async def body() -> float:
        await serve(mgr, "b")
        await serve(mgr, "a")  # b asleep now (sequential: nothing of a's to overlap with yet)
        t = time.perf_counter()
        await serve(mgr, "b")  # the switch under test: a awake -> b
        return time.perf_counter() - t

    return run(body())


def test_overlap_when_the_weights_fit_beside_the_awake_model() -> None:
    gpu, a, b = pair(need_gib=60)  # 80 - 60 - 0.1 free = 19.9 GiB; 15 GiB weights + 2.1 GiB margin fit
    mgr = gpu_manager([a, b], gpu)
    seconds = a_asleep_b_awake(mgr)
    slept, woke = call(a, "sleep"), call(b, "wake weights")
    assert woke[0] < slept[1] and slept[0] < woke[1]  # the two ran at the same time
    assert call(b, "wake kv_cache")[0] >= slept[1]  # the KV cache only once a's memory was free
    last = mgr.slots["b"].last_switch
    assert last["overlap"] and "woken while it sleeps" in last["order"] and seconds < 0.55
    assert {"sleep_a_s", "wake_weights_s", "wake_kv_cache_s", "ready_s", "overlap_s"} <= set(last["phases"])
    # NVML saw b's weights arrive while a left: a's freed memory still verified, its residue small
    assert mgr.slots["a"].state == S.SLEEPING and mgr.slots["a"].residue < GIB
    assert mgr.slots["b"].state == S.READY and b.starts == 1


def test_sequential_once_the_sleeping_model_holds_its_host_copy() -> None:
    """A kept host copy makes b's sleep a release: nothing to hide a's wake under, sequential (measured best)."""
    gpu, a, b = pair(need_gib=60)
    mgr = gpu_manager([a, b], gpu)
    for name in ("a", "b"):
        mgr.slots[name].keeps_host_copy = True

    async def body() -> None:
        await serve(mgr, "b")
        await serve(mgr, "a")  # b's first sleep: it copies, so nothing is held yet (sequential, nothing awake)
        assert mgr.slots["b"].host_copy_held
        await serve(mgr, "b")  # a's first sleep copies: overlapped beside b's weights
        first = mgr.slots["b"].last_switch
        assert first["overlap"] and "woken while it sleeps" in first["order"]
        await serve(mgr, "a")  # b held a copy since its last sleep: it sleeps, then a wakes

    run(body())
    woke, slept = call(a, "wake all"), call(b, "sleep")
    assert slept[1] <= woke[0]  # one after the other, the sleep first, then one wake call
    last = mgr.slots["a"].last_switch
    assert not last["overlap"] and "only releases memory" in last["order"]
    assert mgr.slots["b"].state == S.SLEEPING and mgr.slots["a"].state == S.READY


def test_no_host_copy_held_after_a_restart_or_without_the_setting() -> None:
    gpu, a, b = pair(need_gib=60)
    mgr = gpu_manager([a, b], gpu)
    mgr.slots["a"].keeps_host_copy = True  # b does not keep one (e.g. LoRA on)

    async def body() -> None:
        await serve(mgr, "b")
        await serve(mgr, "a")
        await serve(mgr, "b")
        await serve(mgr, "a")  # b slept before, but keeps no copy: beside
        assert "woken while it sleeps" in mgr.slots["a"].last_switch["order"]
        assert mgr.slots["b"].host_copy_held is False
        await mgr.stop_engine(mgr.slots["a"], "test")  # a new process starts without a copy
        assert mgr.slots["a"].host_copy_held is False

    run(body())


def test_sequential_when_the_weights_do_not_fit_beside() -> None:
    gpu, a, b = pair(need_gib=70)  # 9.9 GiB free beside a: 15 GiB of weights would not fit
    mgr = gpu_manager([a, b], gpu)
    seconds = a_asleep_b_awake(mgr)
    assert call(a, "sleep")[1] <= call(b, "wake all")[0]  # level 1: one wake call
    last = mgr.slots["b"].last_switch
    assert not last["overlap"] and "it sleeps first" in last["order"] and seconds >= 0.6
    assert mgr.slots["a"].state == S.SLEEPING and mgr.slots["b"].state == S.READY


def test_overlap_off_by_setting() -> None:
    gpu, a, b = pair(need_gib=60)
    mgr = gpu_manager([a, b], gpu, overlap_wake=False)
    a_asleep_b_awake(mgr)
    assert not mgr.slots["b"].last_switch["overlap"] and call(a, "sleep")[1] <= call(b, "wake all")[0]


def test_overlapped_sleep_that_frees_nothing_stops_the_model_before_the_kv_cache_wakes() -> None:
    gpu, a, b = pair(need_gib=60)
    mgr = gpu_manager([a, b], gpu)

    async def body() -> None:
        await serve(mgr, "b")
        await serve(mgr, "a")
        a.stuck_sleep = True  # /sleep answers 200, the memory stays
        await serve(mgr, "b")

    run(body())
    assert mgr.slots["a"].state == S.STOPPED and not a.running
    assert mgr.slots["b"].state == S.READY and mgr.slots["b"].last_switch["overlap"]


def test_overlapped_wake_that_fails_falls_back_to_a_cold_start() -> None:
    gpu, a, b = pair(need_gib=60)
    mgr = gpu_manager([a, b], gpu)

    async def body() -> None:
        await serve(mgr, "b")
        await serve(mgr, "a")
        b.fail_wake = True
        await serve(mgr, "b")

    run(body())
    assert b.starts == 2 and mgr.slots["b"].state == S.READY and mgr.slots["b"].last_switch["kind"] == "cold"
    assert mgr.slots["a"].state == S.SLEEPING  # a's sleep went through and was verified


def test_level2_beyond_the_host_budget_reloads_weights_on_wake() -> None:
    gpu, a, b = pair(need_gib=70)
    mgr = gpu_manager([a, b], gpu, host_gib=20)  # a's 15 GiB fit the 20 GiB host budget, b's do not
    assert (str(mgr.slots["a"].tier), str(mgr.slots["b"].tier)) == ("level1", "level2")

    async def body() -> None:
        await serve(mgr, "b")
        await serve(mgr, "a")  # b sleeps at level 2
        await serve(mgr, "b")  # b wakes: weights mapped, reloaded, then the KV cache

    run(body())
    assert b.levels == [2] and a.levels == [1] and b.reloads == 1
    phases = mgr.slots["b"].last_switch["phases"]
    assert "reload_weights_s" in phases and mgr.slots["b"].last_switch["tier"] == "level2"
    status = mgr.status()
    assert status["models"]["b"]["tier"] == "level2" and "do not fit the host RAM budget" in status["models"]["b"][
        "tier_reason"]  # fmt: skip
    assert status["host_budget_gib"] == 20.0


def test_cold_tier_without_sleep_mode_stops_instead() -> None:
    gpu, a, b = pair(need_gib=70)
    slots = [Slot(e.spec.name, e, need=e.need, can_sleep=False) for e in (a, b)]
    mgr = ModelManager(slots, ManagerConfig(min_residency_s=0, quiet_s=0), Capacity(80 * GIB, True, 100 * GIB),
                       probe=gpu)  # fmt: skip
    assert str(mgr.slots["a"].tier) == "cold"

    async def body() -> None:
        await serve(mgr, "a")
        await serve(mgr, "b")

    asyncio.run(body())
    assert a.sleeps == 0 and mgr.slots["a"].state == S.STOPPED and mgr.slots["b"].last_switch["kind"] == "cold"
