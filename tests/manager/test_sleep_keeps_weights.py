"""manager.sleep_keeps_weights (adr/0058): a level-1 sleep in a switch leaves the sleeping model's weights mapped
where they fit beside the model woken in its place, so switching back maps a KV cache and copies no weights.
Stand-in engines on a fake GPU (NVML's used bytes are what they hold); the engine's side (the runtime patch's
sleep that skips the weights) is tested in tests/patches/test_fast_sleep_wake.py."""

from __future__ import annotations

import os

from stack.manager.states import ModelState
from stack.vllm.plugins.handoff import put_pieces

from .conftest import GIB, FakeGpu, StandIn, run
from .test_sleep_handoff_window import PIECE, TaggedHandingStandIn, two_engines
from .test_switch_order import call, gpu_manager, serve

S = ModelState


class Keeping:
    """What the runtime patch does after KEEP_WEIGHTS_METHOD: the next sleep keeps the weights up (held on the
    GPU), and a weights wake of an engine whose weights are up has nothing to do."""

    keep_next = False
    kept_sleeps = 0

    def keep_weights_mapped(self, timeout: float = 30) -> None:
        self.keep_next = True

    def release_kept_weights(self, timeout: float = 60) -> None:
        """RELEASE_WEIGHTS_METHOD: the kept weights leave the GPU; the engine stays asleep."""
        self.calls.append(("release kept weights", 0.0, 0.0))
        if self.asleep:
            self.weights_up = False

    def sleep(self, level: int = 1, timeout: float = 120) -> None:
        keep, self.keep_next = self.keep_next, False
        super().sleep(level, timeout)  # type: ignore[misc]
        if keep:
            self.weights_up, self.kept_sleeps = True, self.kept_sleeps + 1

    def wake_up(self, tags: list[str] | None = None, timeout: float = 120) -> None:
        if tags == ["weights"] and self.asleep and self.weights_up:
            self.calls.append(("wake weights (kept)", 0.0, 0.0))
            return
        wake_s, self.wake_s = self.wake_s, (0.0 if self.weights_up else self.wake_s)  # nothing to copy back
        try:
            super().wake_up(tags, timeout)  # type: ignore[misc]
        finally:
            self.wake_s = wake_s


class KeepingStandIn(Keeping, StandIn):
    pass


class KeepingHandingStandIn(Keeping, TaggedHandingStandIn):
    """Hands over what its sleep releases: everything, or the KV cache alone when it keeps its weights."""

    def sleep(self, level: int = 1, timeout: float = 120) -> None:
        keep, self.keep_next = self.keep_next, False
        StandIn.sleep(self, level, timeout)
        fds = [os.memfd_create("piece") for _ in range((self.need - (self.weights if keep else 0)) // PIECE)]
        self.handed.append(put_pieces(self.broker_path, "gpu-0", [(PIECE, fd) for fd in fds]))
        self.handed_bytes = len(fds) * PIECE
        for fd in fds:
            os.close(fd)
        if keep:
            self.weights_up, self.kept_sleeps = True, self.kept_sleeps + 1


def pair(keep: bool, need_gib: int = 60) -> tuple[KeepingStandIn, KeepingStandIn, object, FakeGpu]:
    """60 GiB each on 80 with 15 GiB of weights: 60 + 15 + the margin (2.1 GiB) fit, so one's weights stay
    beside the other; a weights wake takes 0.5 s when it copies."""
    gpu = FakeGpu()
    a, b = (KeepingStandIn(n, need=need_gib * GIB, gpu=gpu) for n in ("a", "b"))
    for e in (a, b):
        e.weights, e.wake_s = 15 * GIB, 0.5
    return a, b, gpu_manager([a, b], gpu, capacity_gib=80, sleep_keeps_weights=keep), gpu


def test_a_switch_back_maps_no_weights_when_the_sleeping_model_kept_them() -> None:
    a, b, mgr, gpu = pair(keep=True)
    for name in ("a", "b"):  # a sleeps for b: its 15 GiB of weights fit beside b's 60
        run(serve(mgr, name))
    assert mgr.slots["a"].state == S.SLEEPING and mgr.slots["a"].weights_kept and a.kept_sleeps == 1
    assert gpu.used() == 60 * GIB + 15 * GIB + GIB // 8  # b awake, a's weights and context
    assert mgr.slots["a"].view().kept == 15 * GIB  # counted as held by the sleeping model, apart from its residue
    assert mgr.slots["a"].residue < GIB
    assert mgr.slots["a"].public(0)["weights_kept"] is True  # what /admin/models shows
    run(serve(mgr, "a"))  # b sleeps (keeping its weights), a wakes its KV cache only
    assert mgr.slots["a"].state == S.READY and not mgr.slots["a"].weights_kept
    assert mgr.slots["b"].state == S.SLEEPING and mgr.slots["b"].weights_kept
    assert a.starts == 1 and b.starts == 1  # no sleep was judged a failure
    assert mgr.slots["a"].last_switch["seconds"] < 0.4  # no 0.5 s weights copy in it
    assert gpu.used() == 60 * GIB + 15 * GIB + GIB // 8


def test_turned_off_the_same_switch_copies_the_weights_back() -> None:
    a, _b, mgr, gpu = pair(keep=False)
    for name in ("a", "b", "a"):
        run(serve(mgr, name))
    assert a.kept_sleeps == 0 and not mgr.slots["b"].weights_kept
    assert mgr.slots["a"].last_switch["seconds"] >= 0.5  # the weights came back over the bus
    assert gpu.used() == 60 * GIB + GIB // 8


def test_weights_are_not_kept_where_they_would_not_fit_beside_the_woken_model() -> None:
    """70 GiB each on 80: 70 + 15 + the margin is past 80, so the sleep releases everything as before."""
    a, _b, mgr, gpu = pair(keep=True, need_gib=70)
    for name in ("a", "b"):
        run(serve(mgr, name))
    assert a.kept_sleeps == 0 and not mgr.slots["a"].weights_kept
    assert gpu.used() == 70 * GIB + GIB // 8


def test_a_third_model_that_needs_the_kept_weights_memory_gets_it() -> None:
    """a asleep with its 15 GiB kept, b awake, c (60 GiB) asked: b sleeps (its weights would not fit beside c and
    a's), and c fits beside a's kept weights."""
    gpu = FakeGpu()
    a, b, c = (KeepingStandIn(n, need=60 * GIB, gpu=gpu) for n in ("a", "b", "c"))
    for e in (a, b, c):
        e.weights = 15 * GIB
    mgr = gpu_manager([a, b, c], gpu, capacity_gib=80, sleep_keeps_weights=True)
    for name in ("a", "b", "c"):
        run(serve(mgr, name))
    assert mgr.slots["c"].state == S.READY and mgr.slots["a"].weights_kept
    assert mgr.slots["b"].state == S.SLEEPING and not mgr.slots["b"].weights_kept
    assert gpu.used() <= 80 * GIB


def test_a_model_that_needs_a_sleepers_kept_weights_has_them_released_and_the_sleeper_stays_asleep() -> None:
    """a asleep keeping 15 GiB, b awake (60 GiB), c asked with 70 GiB of 80: b sleeps and a's weights go back to
    its host copy (it is not stopped); a's next wake copies them, as a plain sleeper's does."""
    gpu = FakeGpu()
    a, b = (KeepingStandIn(n, need=60 * GIB, gpu=gpu) for n in ("a", "b"))
    c = KeepingStandIn("c", need=70 * GIB, gpu=gpu)
    for e in (a, b, c):
        e.weights, e.wake_s = 15 * GIB, 0.3
    mgr = gpu_manager([a, b, c], gpu, capacity_gib=80, sleep_keeps_weights=True)
    for name in ("a", "b"):
        run(serve(mgr, name))
    assert mgr.slots["a"].weights_kept
    run(serve(mgr, "c"))
    assert mgr.slots["c"].state == S.READY
    assert mgr.slots["a"].state == S.SLEEPING and not mgr.slots["a"].weights_kept and a.starts == 1
    assert call(a, "release kept weights") and not a.weights_up
    assert mgr.slots["b"].state == S.SLEEPING and b.starts == 1
    assert "release a" in mgr.decisions[-1]["evict"] and "stop a" not in mgr.decisions[-1]["evict"]
    assert gpu.used() <= 80 * GIB
    run(serve(mgr, "a"))  # its weights come back over the bus: a plain level-1 wake, not a start
    assert mgr.slots["a"].state == S.READY and a.starts == 1
    assert mgr.slots["a"].last_switch["kind"] == "sleeping" and mgr.slots["a"].last_switch["seconds"] >= 0.3


def test_a_sleeper_whose_weights_cannot_be_released_is_stopped_as_before() -> None:
    """An engine that answers the release with an error (or keeps its memory): stopped, so the model asked gets
    its memory all the same."""
    from stack.errors import EngineError

    gpu = FakeGpu()
    a, b = (KeepingStandIn(n, need=60 * GIB, gpu=gpu) for n in ("a", "b"))
    c = KeepingStandIn("c", need=70 * GIB, gpu=gpu)
    for e in (a, b, c):
        e.weights = 15 * GIB
    mgr = gpu_manager([a, b, c], gpu, capacity_gib=80, sleep_keeps_weights=True)
    for name in ("a", "b"):
        run(serve(mgr, name))

    def refuse(timeout: float = 60) -> None:
        raise EngineError("engine 'a': POST /collective_rpc answered 500")

    a.release_kept_weights = refuse  # type: ignore[method-assign]
    run(serve(mgr, "c"))
    assert mgr.slots["c"].state == S.READY and mgr.slots["a"].state == S.STOPPED
    assert "not released" in mgr.slots["a"].detail
    assert gpu.used() <= 80 * GIB


def test_with_the_handoff_an_overlapped_switch_back_wakes_only_the_kv_cache_from_the_others_pieces() -> None:
    """The default setup on a GPU (memory handoff, kept host copies, overlapped switches): b sleeps beside a's
    wake keeping its weights, hands over only its KV cache (45 GiB), which a's KV cache takes; a's weights wake
    has nothing to copy because a kept them."""
    broker, a, b, mgr = two_engines(60, KeepingHandingStandIn)
    for e in (a, b):
        e.sleep_s = e.wake_s = 0.3
    mgr.handoff = broker
    mgr.settings = mgr.settings.model_copy(update={"sleep_keeps_weights": True})
    for name in ("a", "b"):
        mgr.slots[name].keeps_host_copy = True
    try:
        for name in ("b", "a", "b", "a"):
            run(serve(mgr, name))
    finally:
        broker.stop()
    last = mgr.slots["a"].last_switch
    assert last["overlap"] and mgr.slots["b"].weights_kept and mgr.slots["b"].state == S.SLEEPING
    assert call(a, "wake weights (kept)")  # nothing mapped or copied for a's weights
    assert b.handed_bytes == 45 * GIB and a.taken[-1] == 45 * GIB  # b's KV cache became a's
    assert b.starts == 1 and a.starts == 1 and last["phases"]["handoff_left_gib"] == 0.0


def test_an_engine_that_cannot_keep_its_weights_sleeps_as_always() -> None:
    """An engine without the runtime patch answers the request with an error: the sleep goes on as a plain one,
    the model is not stopped, and the switch back copies its weights."""
    from stack.errors import EngineError

    a, _b, mgr, gpu = pair(keep=True)

    def refuse(timeout: float = 30) -> None:
        raise EngineError("engine 'a': POST /collective_rpc answered 500")

    a.keep_weights_mapped = refuse  # type: ignore[method-assign]
    for name in ("a", "b"):
        run(serve(mgr, name))
    assert mgr.slots["a"].state == S.SLEEPING and not mgr.slots["a"].weights_kept and a.starts == 1
    assert gpu.used() == 60 * GIB + GIB // 8


def test_an_engine_that_released_its_weights_anyway_is_not_counted_as_keeping_them() -> None:
    """NVML decides: the request answered but the sleep freed the weights too, so the model is not marked as
    keeping them and its next wake is planned as one that copies them."""
    a, _b, mgr, _gpu = pair(keep=True)
    a.keep_weights_mapped = lambda timeout=30: None  # type: ignore[method-assign]  # says yes, keeps nothing
    for name in ("a", "b"):
        run(serve(mgr, name))
    assert mgr.slots["a"].state == S.SLEEPING and not mgr.slots["a"].weights_kept and a.starts == 1


def test_the_switch_benchs_trio_releases_the_8bs_kept_weights_for_the_larger_model_and_stops_none() -> None:
    """bench/switch_gpu.py's `trio` as the manager plans it on an H200's 140 GiB: the 8B (98 GiB at 0.7, 15.5 of
    weights) and the 3B (98, 6.6) keep their weights beside each other; the 7B at 0.9 (126) fits only once the 8B's
    kept weights are released. In turn twice: every start and wake of the 7B releases, no model is stopped, and
    the GPU is never over (a sleeping target's own kept weights were once counted twice: 141.75 GiB)."""
    gpu = FakeGpu()
    shapes = {"llama-8b": (98, 15.5), "llama-3b": (98, 6.6), "qwen-7b": (126, 14.9)}
    engines = [KeepingStandIn(n, need=need * GIB, gpu=gpu) for n, (need, _w) in shapes.items()]
    for e, (_need, weights) in zip(engines, shapes.values(), strict=True):
        e.weights = int(weights * GIB)
    mgr = gpu_manager(engines, gpu, capacity_gib=140, sleep_keeps_weights=True)
    for name in ["llama-8b", "llama-3b", "qwen-7b"] * 2 + ["llama-8b"]:
        run(serve(mgr, name))
        assert mgr.slots[name].state == S.READY and gpu.used() <= 140 * GIB
    releases = [d for d in mgr.decisions if "release llama-8b" in d["evict"]]
    assert [d["model"] for d in releases] == ["qwen-7b", "qwen-7b"]
    assert all(e.starts == 1 for e in engines)  # none stopped: every later switch woke a sleeper
    assert mgr.slots["qwen-7b"].weights_kept  # the 7B's own weights stay beside the 8B's whole share
