"""The real ModelManager driven by in-memory stand-in engines: single flight, queue, anti-thrash,
sleep with its NVML check and fallbacks, crashes and restarts, failed starts, idle unloading."""

from __future__ import annotations

import asyncio

import pytest

from stack.config.sections.manager import ManagerConfig
from stack.manager.states import ModelState
from stack.manager.supervise import on_crash, put_away_idle, watch
from stack.manager.unavailable import ModelUnavailable

from .conftest import GIB, FakeGpu, StandIn, build, counter, run

S = ModelState


async def serve(manager, name: str, hold: float = 0.0) -> None:
    ticket = await manager.admit(name)
    await asyncio.sleep(hold)
    ticket.release()


def test_concurrent_requests_start_a_model_once() -> None:
    a = StandIn("a", start_s=0.2)
    mgr = build([a])

    async def body() -> None:
        await asyncio.gather(*(serve(mgr, "a") for _ in range(20)))

    run(body())
    assert a.starts == 1 and mgr.slots["a"].state == S.READY
    assert counter(mgr.metrics, "vstack_manager_switches_total", model="a", kind="cold") == 1
    assert mgr.events[-2:] == [("a", "starting", "starting"), ("a", "starting", "ready")]


def test_co_resident_models_never_evict_each_other() -> None:
    a, b = StandIn("a", need=2 * GIB), StandIn("b", need=2 * GIB)
    mgr = build([a, b], capacity_gib=5)

    async def body() -> None:
        for name in "abababab":
            await serve(mgr, name)

    run(body())
    assert (a.starts, b.starts) == (1, 1)
    assert mgr.slots["a"].state == mgr.slots["b"].state == S.READY


def test_alternating_requests_swap_at_most_once_per_residency() -> None:
    """8 concurrent clients alternate A, B, A, B (llama-swap's thrash pattern) on a machine that holds one
    model: with a 0.5 s residency and requests of 50 ms, swaps are bounded by time, not by requests."""
    a, b = StandIn("a", need=4 * GIB, start_s=0.1), StandIn("b", need=4 * GIB, start_s=0.1)
    settings = ManagerConfig(scheduler="residency", min_residency_s=0.5, quiet_s=0.3, queue_timeout_s=30)
    mgr = build([a, b], settings, capacity_gib=5)
    loop_time = {}

    async def client(i: int) -> None:
        for k in range(10):
            await serve(mgr, "ab"[(i + k) % 2], hold=0.05)

    async def body() -> None:
        t0 = asyncio.get_running_loop().time()
        await asyncio.gather(*(client(i) for i in range(8)))
        loop_time["s"] = asyncio.get_running_loop().time() - t0

    run(body())
    swaps = a.starts + b.starts
    bound = 1 + loop_time["s"] / settings.min_residency_s
    assert swaps <= bound, (swaps, loop_time)
    assert swaps < 80 / 4  # llama-swap without residency: up to one swap per request


def test_queue_is_bounded_and_times_out_with_retry_after() -> None:
    a = StandIn("a", start_s=1.0)
    mgr = build([a], ManagerConfig(queue_max=2, queue_timeout_s=0.3, min_residency_s=0))

    async def body() -> list:
        return await asyncio.gather(*(mgr.admit("a") for _ in range(3)), return_exceptions=True)

    results = run(body())
    errors = [r for r in results if isinstance(r, ModelUnavailable)]
    assert len(errors) == 3  # one refused at once (queue full), two timed out
    assert any("queue is full" in e.message for e in errors)
    assert all(e.retry_after == 5 for e in errors)


def test_spill_returns_none_and_switches_in_the_background() -> None:
    a = StandIn("a", start_s=0.1)
    mgr = build([a])

    async def body() -> None:
        assert await mgr.admit("a", can_spill=True) is None
        await asyncio.wait_for(mgr.request_switch("a"), 10)  # the switch the spill started (single flight)
        assert mgr.slots["a"].state == S.READY

    run(body())


def test_gpu_switch_sleeps_the_other_and_wakes_it_back() -> None:
    gpu = FakeGpu()
    a, b = StandIn("a", need=70 * GIB, gpu=gpu), StandIn("b", need=70 * GIB, gpu=gpu)
    mgr = build([a, b], capacity_gib=80, sleep=True, gpu=gpu)

    async def body() -> None:
        await serve(mgr, "a")
        await serve(mgr, "b")
        assert mgr.slots["a"].state == S.SLEEPING and a.sleeps == 1
        await serve(mgr, "a")

    run(body())
    assert a.starts == 1 and a.wakes == 1 and mgr.slots["b"].state == S.SLEEPING
    assert mgr.slots["a"].last_switch["kind"] == "sleeping"
    assert counter(mgr.metrics, "vstack_manager_evictions_total", model="a", action="sleep") == 1


def test_sleep_that_frees_nothing_falls_back_to_stop() -> None:
    gpu = FakeGpu()
    a, b = StandIn("a", need=70 * GIB, gpu=gpu), StandIn("b", need=70 * GIB, gpu=gpu)
    a.stuck_sleep = True  # the vLLM bug: /sleep answers 200, memory stays
    mgr = build([a, b], capacity_gib=80, sleep=True, gpu=gpu)

    async def body() -> None:
        await serve(mgr, "a")
        await serve(mgr, "b")

    run(body())
    assert mgr.slots["a"].state == S.STOPPED and not a.running and mgr.slots["b"].state == S.READY


def test_failed_wake_falls_back_to_cold_start() -> None:
    gpu = FakeGpu()
    a, b = StandIn("a", need=70 * GIB, gpu=gpu), StandIn("b", need=70 * GIB, gpu=gpu)
    mgr = build([a, b], capacity_gib=80, sleep=True, gpu=gpu)

    async def body() -> None:
        await serve(mgr, "a")
        await serve(mgr, "b")
        a.fail_wake = True
        await serve(mgr, "a")

    run(body())
    assert a.starts == 2 and mgr.slots["a"].state == S.READY and mgr.slots["a"].last_switch["kind"] == "cold"


def test_failed_start_reports_log_tail_and_leaves_the_other_model_alone() -> None:
    a, bad = StandIn("a"), StandIn("bad")
    bad.fail_start = True
    mgr = build([a, bad])

    async def body() -> None:
        await serve(mgr, "a")
        with pytest.raises(ModelUnavailable, match="failed"):
            await mgr.admit("bad")
        with pytest.raises(ModelUnavailable, match="failed"):  # within retry_failed_s: refused at once
            await mgr.admit("bad")
        await serve(mgr, "a")

    run(body())
    slot = mgr.slots["bad"]
    assert slot.state == S.FAILED and "config.json" in slot.log_tail
    assert mgr.events[-1][0] == "bad" and mgr.events[-1][2] == "failed" and mgr.slots["a"].state == S.READY
    assert mgr.status()["models"]["bad"]["log_tail"]


def test_crash_restarts_with_backoff_then_fails_with_log_tail() -> None:
    a = StandIn("a")
    mgr = build([a], ManagerConfig(restart_max=2, restart_backoff_s=0.05, min_residency_s=0))

    async def body() -> None:
        await serve(mgr, "a")
        for _ in range(2):
            a.crash()
            await on_crash(mgr, mgr.slots["a"])
            assert mgr.slots["a"].state == S.STARTING
            await serve(mgr, "a")  # waits for the restart
        a.crash()
        await on_crash(mgr, mgr.slots["a"])

    run(body())
    assert a.starts == 3 and mgr.slots["a"].state == S.FAILED
    assert "RuntimeError" in mgr.slots["a"].log_tail
    assert counter(mgr.metrics, "vstack_manager_restarts_total", model="a") == 2


def test_a_dead_engine_is_never_shown_ready_while_its_leftovers_are_stopped() -> None:
    """The state moves as soon as the exit is seen: stopping what is left of the engine (its engine-core
    child) takes up to the grace period, and /admin/models (`vstack models`) showed `ready, pid N` of the
    dead process all that time."""
    a = StandIn("a")
    mgr = build([a], ManagerConfig(restart_max=1, restart_backoff_s=0, min_residency_s=0))
    seen: list[str] = []
    stop = a.stop

    def slow_stop(grace: float = 20) -> list[int]:
        seen.append(mgr.status()["models"]["a"]["state"])  # what a `vstack models` during the stop shows
        return stop(grace)

    async def body() -> None:
        await serve(mgr, "a")
        a.stop = slow_stop  # type: ignore[method-assign]
        a.crash()
        await on_crash(mgr, mgr.slots["a"])

    run(body())
    assert seen and "ready" not in seen, seen


def test_watch_notices_a_crash_within_a_second() -> None:
    a = StandIn("a")
    mgr = build([a], ManagerConfig(restart_max=1, restart_backoff_s=0, min_residency_s=0))

    async def body() -> None:
        await serve(mgr, "a")
        task = asyncio.create_task(watch(mgr, interval=0.1))
        a.crash()
        for _ in range(20):
            await asyncio.sleep(0.05)
            if a.starts == 2 and mgr.slots["a"].state == S.READY:
                break
        mgr.stopping = True
        await task

    run(body())
    assert a.starts == 2 and mgr.slots["a"].state == S.READY


def test_idle_models_sleep_on_gpu_and_stop_on_cpu() -> None:
    now = [0.0]
    gpu = FakeGpu()
    a = StandIn("a", gpu=gpu)
    mgr = build([a], ManagerConfig(idle_ttl_s=60, sleep_ttl_s=600), sleep=True, gpu=gpu, clock=lambda: now[0])
    cpu = build([StandIn("c")], ManagerConfig(idle_ttl_s=60), clock=lambda: now[0])

    async def body() -> None:
        await serve(mgr, "a")
        await serve(cpu, "c")
        now[0] = 61
        await put_away_idle(mgr)
        await put_away_idle(cpu)
        assert mgr.slots["a"].state == S.SLEEPING and cpu.slots["c"].state == S.STOPPED
        now[0] = 700
        await put_away_idle(mgr)

    run(body())
    assert mgr.slots["a"].state == S.STOPPED


def test_unload_waits_for_in_flight_requests() -> None:
    a = StandIn("a")
    mgr = build([a])

    async def body() -> None:
        ticket = await mgr.admit("a")
        unload = asyncio.create_task(mgr.unload("a"))
        await asyncio.sleep(0.3)
        assert a.running  # still serving
        ticket.release()
        await unload

    run(body())
    assert mgr.slots["a"].state == S.STOPPED and not a.running


class Staging(StandIn):
    """A stand-in with the runtime patch's staging call (stack.engine.runtime.SleepEndpoints.stage_host_copy)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.staged = 0

    def stage_host_copy(self, timeout: float = 30) -> None:
        self.staged += 1


def test_a_model_that_sleeps_to_host_ram_stages_its_host_buffers_once_ready_not_at_its_first_switch() -> None:
    from stack.manager.tiers import Tier

    gpu = FakeGpu()
    a, b = Staging("a", need=70 * GIB, gpu=gpu), Staging("b", need=70 * GIB, gpu=gpu)
    mgr = build([a, b], capacity_gib=80, sleep=True, gpu=gpu)
    mgr.slots["a"].tier, mgr.slots["b"].tier = Tier.LEVEL1, Tier.COLD  # b: stopped, never sleeps to host
    mgr.slots["a"].keeps_host_copy = True

    async def body() -> None:
        await serve(mgr, "a")
        for _ in range(50):  # staged in the background of the ready engine
            if mgr.slots["a"].host_copy_held:
                break
            await asyncio.sleep(0.01)
        assert a.staged == 1 and mgr.slots["a"].host_copy_held, "staged right after the start, before any switch"
        assert a.sleeps == 0
        await serve(mgr, "b")

    run(body())
    assert a.staged == 1 and b.staged == 0, "a model that is stopped, not put to sleep, holds no host buffers"


def test_a_model_alone_stages_nothing_its_only_sleep_is_the_one_down_asks_for() -> None:
    """One GPU model runs with sleep mode so that `vstack down` can keep it (adr/0030), but nothing switches it:
    staging would pin its weights' size in host RAM for the engine's whole life."""
    from stack.manager.tiers import Tier

    gpu = FakeGpu()
    a = Staging("a", need=70 * GIB, gpu=gpu)
    mgr = build([a], capacity_gib=80, sleep=True, gpu=gpu)
    mgr.slots["a"].tier = Tier.LEVEL1
    mgr.slots["a"].keeps_host_copy = True

    async def body() -> None:
        await serve(mgr, "a")
        await asyncio.sleep(0.2)  # time enough for a background staging (the test above sees it within 0.5 s)

    run(body())
    assert a.staged == 0 and not mgr.slots["a"].host_copy_held


def test_each_switch_is_a_trace_whose_phases_are_its_spans() -> None:
    from stack.config.sections.observability import TracingConfig
    from stack.tracing.settings import resolve
    from stack.tracing.tracer import tracer_for

    gpu = FakeGpu()
    a, b = StandIn("a", need=70 * GIB, gpu=gpu), StandIn("b", need=70 * GIB, gpu=gpu)
    mgr = build([a, b], capacity_gib=80, sleep=True, gpu=gpu)
    mgr.tracer = tracer_for(resolve(TracingConfig(keep=10), environ={}))  # kept for the console, not exported

    async def body() -> None:
        for name in "aba":
            await serve(mgr, name)

    run(body())
    traces = mgr.tracer.buffer.views()
    assert [t["spans"][0]["name"] for t in traces] == ["manager.switch a", "manager.switch b", "manager.switch a"]
    phases = [sorted(s["name"] for s in t["spans"][1:]) for t in traces]
    assert phases[0] == ["manager.start a", "manager.wait_ready a"]  # a cold start
    assert phases[1] == ["manager.sleep a", "manager.start b", "manager.wait_ready b"]  # a put to sleep for b
    # b put to sleep, a woken back: its weights, their reload (level 2 here), its KV cache, ready
    assert phases[2] == ["manager.ready", "manager.reload_weights", "manager.sleep b", "manager.wake_kv_cache",
                         "manager.wake_weights"]  # fmt: skip
    woke = traces[2]
    assert woke["spans"][0]["attributes"]["vstack.switch.kind"] == "sleeping"
    # what a request that waited for it reads (the gateway's admission span): its kind and trace
    assert mgr.last_switch("a")["trace_id"] == woke["trace_id"] and mgr.last_switch("a")["kind"] == "sleeping"
