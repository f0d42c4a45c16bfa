"""The manager's side of the sleep-mode memory handoff (manager.sleep_handoff, adr/0016): a window around a
sequential switch to a sleeping model, the handed-over bytes counted as freed when the evicted model's sleep is
verified, nothing held once the switch ends. Stand-in engines on a fake GPU hand real memfd descriptors through
the real broker, as the runtime patch does with exported CUDA memory on the lent GPU."""

from __future__ import annotations

import os

from stack.manager.states import ModelState
from stack.vllm.plugins.handoff import HandoffBroker, put_pieces, take_pieces

from .conftest import GIB, FakeGpu, StandIn, run
from .test_switch_order import call, gpu_manager, serve

S = ModelState
PIECE = 512 * 1024**2


class HandingGpu(FakeGpu):
    broker: HandoffBroker | None = None

    def used(self) -> int | None:  # what the broker holds is still in use on the GPU
        return super().used() + (self.broker.held_bytes() if self.broker else 0)


class HandingStandIn(StandIn):
    """Sleeps hand its memory to the broker (kept inside a window, else freed); wakes take what is there."""

    def __init__(self, name: str, need: int, gpu: HandingGpu) -> None:
        super().__init__(name, need=need, gpu=gpu)
        self.broker_path = ""
        self.handed: list[bool] = []
        self.taken: list[int] = []

    def sleep(self, level: int = 1, timeout: float = 120) -> None:
        super().sleep(level, timeout)
        fds = [os.memfd_create("piece") for _ in range(self.need // PIECE)]
        self.handed.append(put_pieces(self.broker_path, "gpu-0", [(PIECE, fd) for fd in fds]))
        for fd in fds:
            os.close(fd)

    def wake_up(self, tags: list[str] | None = None, timeout: float = 120) -> None:
        got = take_pieces(self.broker_path, "gpu-0", {PIECE: self.need // PIECE})
        self.taken.append(len(got) * PIECE)
        for _size, fd in got:
            os.close(fd)
        super().wake_up(tags, timeout)


def two_engines(need_gib: int = 70, cls: type[HandingStandIn] = HandingStandIn,
                ) -> tuple[HandoffBroker, HandingStandIn, HandingStandIn, object]:  # fmt: skip
    """70 GiB each on 80 (the default): B's 15 GiB of weights do not fit beside A, so a switch between them is
    sequential; at 60 they fit."""
    gpu = HandingGpu()
    broker = HandoffBroker().start()  # in the system temp folder: a tmp_path can be too long for AF_UNIX
    gpu.broker = broker
    a, b = cls("a", need_gib * GIB, gpu), cls("b", need_gib * GIB, gpu)
    for e in (a, b):
        e.weights, e.broker_path = 15 * GIB, broker.path
    return broker, a, b, gpu_manager([a, b], gpu, capacity_gib=80)


def test_a_switch_to_a_sleeping_model_hands_the_memory_over_and_keeps_nothing_after() -> None:
    broker, a, b, mgr = two_engines()
    mgr.handoff = broker
    try:
        run(serve(mgr, "b"))
        run(serve(mgr, "a"))  # a cold start: no wake to hand memory to, so b's sleep frees its memory
        assert b.handed == [False] and broker.held_bytes() == 0
        run(serve(mgr, "b"))  # a -> b, b asleep: a's sleep hands its memory to b's wake
    finally:
        broker.stop()
    assert a.handed == [True] and b.taken[-1] == 70 * GIB
    # NVML still showed a's 70 GiB in use after its sleep (the broker held it): counted as freed, not stopped.
    assert mgr.slots["a"].state == S.SLEEPING and a.starts == 1
    assert mgr.slots["b"].state == S.READY
    assert mgr.slots["b"].last_switch["phases"]["handoff_left_gib"] == 0.0
    assert broker.held_bytes() == 0 and broker.stats["handed"] == 140


def test_without_the_window_the_same_sleep_would_not_count_as_freed() -> None:
    """The control: the broker keeps the memory but the manager does not know (no `handoff`): NVML shows the
    sleep freed nothing and the manager stops the engine instead, as it must for a sleep that frees nothing."""
    broker, _a, _b, mgr = two_engines()
    broker.open_window()  # held outside the manager's knowledge
    try:
        run(serve(mgr, "b"))
        run(serve(mgr, "a"))
    finally:
        broker.stop()
    assert mgr.slots["b"].state == S.STOPPED


def test_each_sleep_is_credited_only_with_what_it_handed_over(tmp_path) -> None:
    """Two models make room for a third in one window: the first hands its memory over, the second's sleep frees
    nothing and hands nothing. The broker's holdings from the first must not pass the second's check."""
    gpu = HandingGpu()
    broker = HandoffBroker().start()  # in the system temp folder: a tmp_path can be too long for AF_UNIX
    gpu.broker = broker
    a, b, c = (HandingStandIn(n, need * GIB, gpu) for n, need in (("a", 35), ("b", 35), ("c", 70)))
    for e in (a, b, c):
        e.weights, e.broker_path = 10 * GIB, broker.path
    b.broker_path, b.stuck_sleep = str(tmp_path / "nowhere.sock"), True
    mgr = gpu_manager([a, b, c], gpu, capacity_gib=80)
    mgr.handoff = broker
    try:
        for name in ("c", "a", "b", "c"):  # the last: c asleep, a and b both evicted for it
            run(serve(mgr, name))
    finally:
        broker.stop()
    assert a.handed[-1] is True and mgr.slots["a"].state == S.SLEEPING
    assert mgr.slots["b"].state == S.STOPPED  # its sleep freed nothing: stopped, not credited with a's bytes
    assert mgr.slots["c"].state == S.READY


class TaggedHandingStandIn(HandingStandIn):
    """As the runtime patch does: a wake of the weights takes pieces for the weights, of the KV cache for the
    rest, of everything for all (in 512 MiB pieces here)."""

    def wake_up(self, tags: list[str] | None = None, timeout: float = 120) -> None:
        share = {None: self.need, ("weights",): self.weights, ("kv_cache",): self.need - self.weights}
        got = take_pieces(self.broker_path, "gpu-0", {PIECE: share[tuple(tags) if tags else None] // PIECE})
        self.taken.append(len(got) * PIECE)
        for _size, fd in got:
            os.close(fd)
        StandIn.wake_up(self, tags, timeout)


def overlapping_pair() -> tuple[HandoffBroker, TaggedHandingStandIn, TaggedHandingStandIn, object]:
    """60 GiB each on 80, both keeping their host copy, with the handoff: from the 4th switch on (b, a, b, then a)
    the sleep only releases memory and runs under the other's weight wake. Sleeps and wakes take 0.3 s, so a
    sleep hands its pieces over after the weights' wake began, as on the GPU."""
    broker, a, b, mgr = two_engines(60, TaggedHandingStandIn)
    for e in (a, b):
        e.sleep_s = e.wake_s = 0.3
    mgr.handoff = broker
    for name in ("a", "b"):
        mgr.slots[name].keeps_host_copy = True
    return broker, a, b, mgr


def test_with_the_handoff_a_release_only_sleep_overlaps_the_weights_and_hands_its_memory_to_the_kv_cache() -> None:
    """60 GiB each on 80: B's 15 GiB of weights fit beside A. A keeps its host copy, so its sleep only releases
    memory (sequential without the handoff); with it, A's sleep runs under B's weight wake and its memory goes to
    B's KV cache in the same window, counted as freed, and nothing is held after."""
    broker, a, b, mgr = overlapping_pair()
    try:
        for name in ("b", "a", "b", "a"):  # the last: b held a copy since its last sleep (release only)
            run(serve(mgr, name))
    finally:
        broker.stop()
    last = mgr.slots["a"].last_switch
    assert mgr.slots["b"].host_copy_held and last["overlap"]
    assert "woken while it sleeps (its memory handed to the KV cache)" in last["order"]
    slept, weights, kv = call(b, "sleep"), call(a, "wake weights"), call(a, "wake kv_cache")
    assert weights[0] < slept[1] and slept[0] < weights[1]  # the sleep ran under the weights' wake
    assert kv[0] >= slept[1]  # the KV cache once b's memory was handed over
    assert b.handed[-1] is True and a.taken[-1] == 45 * GIB  # b's memory went to a's KV cache
    assert mgr.slots["b"].state == S.SLEEPING and b.starts == 1  # handed over, so counted as freed
    assert last["phases"]["handoff_left_gib"] == 15.0  # b's 60 GiB, 45 of them taken: the rest freed
    assert broker.held_bytes() == 0 and mgr.slots["a"].state == S.READY


def test_without_the_handoff_a_release_only_sleep_stays_sequential(tmp_path) -> None:
    """The control for the test above: the same engines and switch, no broker: sequential (measured best)."""
    gpu = FakeGpu()
    a, b = StandIn("a", need=60 * GIB, gpu=gpu), StandIn("b", need=60 * GIB, gpu=gpu)
    for e in (a, b):
        e.weights, e.sleep_s, e.wake_s = 15 * GIB, 0.3, 0.3
    mgr = gpu_manager([a, b], gpu, capacity_gib=80)
    for name in ("a", "b"):
        mgr.slots[name].keeps_host_copy = True
    for name in ("b", "a", "b", "a"):
        run(serve(mgr, name))
    assert "only releases memory" in mgr.slots["a"].last_switch["order"]


def test_what_no_engine_took_is_freed_after_the_switch_and_before_the_next(monkeypatch) -> None:
    """Closing the last descriptor of GPU memory frees it in the driver, taking time with the bytes (16.6 GiB
    are left after a 3B -> 8B switch on an H200). The switch does not wait for it; the next switch does, before
    it reads the GPU's memory."""
    import time as clock

    from stack.vllm.plugins import handoff

    freeing: list[tuple[float, float]] = []
    real = handoff._close_pieces

    def slow_close(pieces, size=0):  # the driver freeing the bytes: 1 s here
        t = clock.perf_counter()
        clock.sleep(1.0)
        real(pieces, size)
        freeing.append((t, clock.perf_counter()))

    monkeypatch.setattr(handoff, "_close_pieces", slow_close)
    broker, _a, _b, mgr = overlapping_pair()
    try:
        for name in ("b", "a", "b"):
            run(serve(mgr, name))
        broker.wait_dropped()  # the last switch's leftover: the one timed next starts with nothing freeing
        before = len(freeing)
        run(serve(mgr, "a"))  # b -> a, overlapped: 15 GiB of b's 60 are left for the driver to free
        served = clock.perf_counter()
        assert mgr.slots["a"].last_switch["phases"]["handoff_left_gib"] == 15.0
        assert broker.dropping  # served while the leftover is still being freed
        opened: list[float] = []
        real_open = broker.open_window
        monkeypatch.setattr(broker, "open_window",
                            lambda *args: (real_open(*args), opened.append(clock.perf_counter())))  # fmt: skip
        run(serve(mgr, "b"))  # the next switch: its window opens once the last one's leftover is freed
    finally:
        broker.stop()
    assert served < freeing[before][1]  # b -> a's leftover was freed after its request was served
    assert opened and opened[0] >= freeing[before][1]  # and before the next switch opened its window
    assert broker.held_bytes() == 0 and not broker.dropping


def test_an_overlapped_switch_times_its_memory_readings_as_a_phase() -> None:
    """NVML is read before the sleep and after it; on the GPU those readings may be part of the 25-38 ms a 3B -> 8B
    switch spent outside every phase (2026-11-29). A GPU whose readings take 50 ms each shows them as 0.1 s."""
    import time as clock

    broker, _a, _b, mgr = overlapping_pair()
    try:
        for name in ("b", "a", "b"):
            run(serve(mgr, name))
        reading = mgr.probe.used
        mgr.probe.used = lambda: (clock.sleep(0.05), reading())[1]  # type: ignore[method-assign]
        run(serve(mgr, "a"))
    finally:
        broker.stop()
    last = mgr.slots["a"].last_switch
    assert last["overlap"] and 0.1 <= last["phases"]["memory_readings_s"] < 0.3, last


def test_with_a_spare_the_next_weights_wake_maps_the_last_switchs_leftover_not_fresh_memory() -> None:
    """manager.handoff_spare (adr/0057): on the lent x2 H200 a weights wake's fresh memory took 0.38 s to map for
    15.5 GiB, handed-over pieces 0.05 s for 81.6 GiB. With it on, the 15 GiB b -> a leaves (b's 60 handed, a's KV
    cache takes 45) stay with the broker, and a -> b's weights wake takes them instead of creating its own; the
    sleeps still verify (the spare is counted as memory the broker holds, not as the engines')."""
    broker, a, b, mgr = overlapping_pair()
    mgr.settings = mgr.settings.model_copy(update={"handoff_spare": True})
    try:
        for name in ("b", "a", "b", "a"):  # the last: b -> a overlapped, b's weights the spare's budget
            run(serve(mgr, name))
        first = mgr.slots["a"].last_switch["phases"]
        assert first["handoff_left_gib"] == 0.0 and first["handoff_spare_gib"] == 15.0
        assert broker.held_bytes() == 15 * GIB  # kept between switches: NVML shows it in use
        taken_before = len(b.taken)
        run(serve(mgr, "b"))  # a -> b: b's weights wake runs beside a's sleep, before a hands anything over
    finally:
        broker.stop()
    weights_wake, kv_wake = b.taken[taken_before:]
    assert weights_wake == 15 * GIB and kv_wake == 45 * GIB  # the spare, then a's pieces
    last = mgr.slots["b"].last_switch
    assert last["overlap"] and last["phases"]["handoff_spare_gib"] == 15.0  # a's leftover kept in turn
    assert mgr.slots["a"].state == S.SLEEPING and a.starts == 1 and mgr.slots["b"].state == S.READY
    assert broker.held_bytes() == 0  # stop() frees the spare with the rest


def test_without_the_spare_the_same_weights_wake_finds_nothing_to_map() -> None:
    """The control: the default frees the leftover after each switch (adr/0055), so a -> b's weights wake beside
    a's sleep finds no piece and creates all 15 GiB."""
    broker, _a, b, mgr = overlapping_pair()
    try:
        for name in ("b", "a", "b", "a"):
            run(serve(mgr, name))
        assert "handoff_spare_gib" not in mgr.slots["a"].last_switch["phases"]
        taken_before = len(b.taken)
        run(serve(mgr, "b"))
    finally:
        broker.stop()
    assert b.taken[taken_before:] == [0, 45 * GIB]


def test_the_spare_is_freed_before_an_engine_starts() -> None:
    """vLLM's start checks that NVML shows its share of the GPU free: the spare goes first, and the start sees it
    gone (the stand-in records the broker's holdings at its start)."""
    seen: list[int] = []
    broker, a, _b, mgr = overlapping_pair()
    mgr.settings = mgr.settings.model_copy(update={"handoff_spare": True})
    try:
        for name in ("b", "a", "b", "a"):
            run(serve(mgr, name))
        assert broker.held_bytes() == 15 * GIB
        run(mgr.unload("a"))  # stopped: its next request starts it cold
        real_start = a.start
        a.start = lambda: (seen.append(broker.held_bytes()), real_start())[1]  # type: ignore[method-assign]
        run(serve(mgr, "a"))
    finally:
        broker.stop()
    assert seen == [0] and mgr.slots["a"].state == S.READY


def test_the_broker_keeps_the_smallest_pieces_up_to_the_spare_and_drop_spare_frees_them() -> None:
    """Pieces by size as the patch hands them (512/32/2 MiB): a 40 MiB spare keeps the 2 and 32 MiB ones, not a
    512 MiB one; take_pieces reaches them with no window open; drop_spare does nothing while a window is open."""
    mib = 1024**2
    broker = HandoffBroker().start()
    try:
        broker.open_window()
        fds = [os.memfd_create("piece") for _ in range(4)]
        assert put_pieces(broker.path, "gpu-0", [(2 * mib, fds[0]), (2 * mib, fds[1]), (32 * mib, fds[2]),
                                                 (512 * mib, fds[3])])  # fmt: skip
        for fd in fds:
            os.close(fd)
        assert broker.close_window(keep_bytes=40 * mib) == 512 * mib  # the bytes freed
        assert broker.held_bytes() == 36 * mib
        got = take_pieces(broker.path, "gpu-0", {2 * mib: 1})
        assert [size for size, _fd in got] == [2 * mib]
        for _size, fd in got:
            os.close(fd)
        broker.open_window()
        assert broker.drop_spare() == 0 and broker.held_bytes() == 34 * mib  # a switch is using it
        broker.close_window(keep_bytes=34 * mib)
        assert broker.drop_spare() == 34 * mib and broker.held_bytes() == 0
    finally:
        broker.stop()
