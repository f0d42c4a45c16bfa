"""manager.warm_handoff (issue 58, adr/0053): a started engine sleeps and wakes once after its staging, so its
first switch hands memory over as later ones do; requests queue meanwhile and are served after it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from stack.config.sections.manager import ManagerConfig
from stack.manager.states import ModelState
from stack.manager.tiers import Tier

from .conftest import GIB, FakeGpu, StandIn, build, run

S = ModelState


class Staged(StandIn):
    """A stand-in with the runtime patch's staging calls: staging is `busy` for `busy_polls` polls."""

    def __init__(self, *args, busy_polls: int = 2, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.staged, self.polls, self.busy_polls = 0, 0, busy_polls

    def stage_host_copy(self, timeout: float = 30) -> None:
        self.staged += 1

    def host_copy_busy(self, timeout: float = 10) -> bool:
        self.polls += 1
        return self.polls <= self.busy_polls


def manager(warm: bool) -> tuple:
    gpu = FakeGpu()
    a, b = Staged("a", need=70 * GIB, gpu=gpu), Staged("b", need=70 * GIB, gpu=gpu)
    settings = ManagerConfig(min_residency_s=0, quiet_s=0, queue_timeout_s=5, warm_handoff=warm)
    mgr = build([a, b], settings, capacity_gib=80, sleep=True, gpu=gpu)
    for slot in mgr.slots.values():
        slot.tier, slot.keeps_host_copy = Tier.LEVEL1, True
    mgr.handoff = SimpleNamespace(dropping=False, held_bytes=lambda: 0)  # the broker: present, nothing held or freeing
    return mgr, a, b


async def warmed(mgr, name: str) -> bool:
    return await mgr._warming[name]


def test_a_started_engine_sleeps_and_wakes_once_after_its_staging_and_then_serves() -> None:
    mgr, a, _b = manager(warm=True)

    async def body() -> None:
        (await mgr.admit("a")).release()
        assert await warmed(mgr, "a") is True

    run(body())
    assert (a.staged, a.sleeps, a.wakes) == (1, 1, 1)
    assert a.polls == 3, "it waited while the engine said its staging was busy"
    slot = mgr.slots["a"]
    assert slot.state == S.READY and slot.detail.startswith("warm hand-over done in")
    assert mgr.events[-3:] == [("a", "ready", "sleeping"), ("a", "sleeping", "starting"), ("a", "starting", "ready")]


def test_a_request_during_the_warm_hand_over_waits_for_it_and_is_served() -> None:
    mgr, a, _b = manager(warm=True)
    a.sleep_s = a.wake_s = 0.2

    async def body() -> None:
        (await mgr.admit("a")).release()
        while mgr.slots["a"].state != S.SLEEPING:
            await asyncio.sleep(0.01)
        ticket = await mgr.admit("a")  # queued while it sleeps and wakes
        assert a.wakes == 1 and mgr.slots["a"].state == S.READY
        ticket.release()

    run(body())
    assert (a.sleeps, a.wakes, a.starts) == (1, 1, 1), "no second start or switch for the queued request"


def test_a_request_in_flight_keeps_it_serving_and_the_warm_hand_over_is_skipped() -> None:
    mgr, a, _b = manager(warm=False)  # called by hand below, with a short wait for an idle moment

    async def body() -> None:
        ticket = await mgr.admit("a")
        staged = asyncio.create_task(asyncio.sleep(0))
        assert await asyncio.wait_for(mgr._warm_handoff(mgr.slots["a"], a, staged, idle_wait_s=0.3), 5) is False
        ticket.release()

    run(body())
    assert a.sleeps == 0 and mgr.slots["a"].state == S.READY


def test_while_it_waits_for_an_idle_moment_new_requests_are_served_at_once() -> None:
    """A long request in flight when the staging ends: the warm hand-over waits for it, but a request arriving
    meanwhile is admitted at once (not queued behind the wait), and the hand-over runs once both are done."""
    mgr, a, _b = manager(warm=False)
    a.busy_polls = 0  # staging done: the hand-over goes straight to its wait

    async def body() -> None:
        long = await mgr.admit("a")
        staged = asyncio.create_task(asyncio.sleep(0))
        warm = asyncio.create_task(mgr._warm_handoff(mgr.slots["a"], a, staged, idle_wait_s=5))
        await asyncio.sleep(0.3)
        t0 = asyncio.get_running_loop().time()
        short = await asyncio.wait_for(mgr.admit("a"), 1)
        assert asyncio.get_running_loop().time() - t0 < 0.1 and a.sleeps == 0
        short.release()
        long.release()
        assert await asyncio.wait_for(warm, 5) is True

    run(body())
    assert (a.sleeps, a.wakes) == (1, 1) and mgr.slots["a"].state == S.READY


def test_a_failed_warm_sleep_stops_the_engine_rather_than_serving_from_an_unknown_state() -> None:
    mgr, a, _b = manager(warm=True)
    a.fail_sleep = True

    async def body() -> None:
        (await mgr.admit("a")).release()
        assert await warmed(mgr, "a") is False

    run(body())
    assert mgr.slots["a"].state == S.STOPPED and not a.running


def test_on_by_default_and_never_when_turned_off_or_without_the_handoff() -> None:
    assert ManagerConfig().warm_handoff is True  # measured on an H200 (adr/0053): first switch 1.05x steady
    for warm, handoff in ((False, True), (True, False)):
        mgr, a, _b = manager(warm=warm)
        if not handoff:
            mgr.handoff = None

        async def body(mgr=mgr) -> None:
            (await mgr.admit("a")).release()
            await asyncio.sleep(0.2)

        run(body())
        assert a.sleeps == 0 and "a" not in mgr._warming


def test_the_engine_says_busy_while_its_staging_holds_the_lock_and_the_runtime_reads_it(monkeypatch) -> None:
    """The runtime patch's collective_rpc answer (one result per worker) as LocalEngine.host_copy_busy reads it."""
    import httpx

    from stack.engine import runtime as rt
    from stack.vllm.plugins.host_copy import STAGING_METHOD
    from stack.vllm.plugins.runtime_patches import fast_sleep_wake as fsw

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/collective_rpc" and STAGING_METHOD in request.content.decode()
        return httpx.Response(200, json={"results": [fsw._host_copy_staging(None)]})

    monkeypatch.setattr(rt, "control_client", lambda: httpx.Client(transport=httpx.MockTransport(handler)))
    engine = SimpleNamespace(spec=SimpleNamespace(base_url="http://engine", api_key=None))
    with fsw._busy:
        assert rt.SleepEndpoints.host_copy_busy(engine) is True
    assert rt.SleepEndpoints.host_copy_busy(engine) is False
    monkeypatch.setattr(rt, "control_client", lambda: httpx.Client(transport=httpx.MockTransport(
        lambda r: httpx.Response(404, text="no such method"))))  # fmt: skip
    assert rt.SleepEndpoints.host_copy_busy(engine) is False, "an engine that cannot say: its sleep waits instead"
