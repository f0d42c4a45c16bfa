"""The switching rules as plain values: no engine, no clock, no I/O."""

from __future__ import annotations

import pytest

from stack.config.switch_schedulers import Residency, Rules
from stack.manager.policy import (
    Capacity,
    Evict,
    Eviction,
    EvictionOrder,
    IdleAction,
    ModelView,
    SwitchKind,
    held,
    idle_action,
    plan_switch,
    restart_delay,
    sleep_freed_enough,
)
from stack.manager.states import ALLOWED, ModelState, TransitionError, check_move

GIB = 1024**3
S = ModelState
GPU = Capacity(80 * GIB, sleep_supported=True)
CPU = Capacity(10 * GIB, sleep_supported=False)


def m(name: str, state: S = S.STOPPED, need: float | None = 4, used: float = 0, **kw) -> ModelView:
    return ModelView(name, state, None if need is None else int(need * GIB), last_used=used, **kw)


def test_a_ready_model_is_resident() -> None:
    assert plan_switch(m("a", S.READY), [m("b", S.READY)], CPU).kind == SwitchKind.RESIDENT


def test_co_resident_when_both_fit() -> None:
    plan = plan_switch(m("b", need=4), [m("a", S.READY, need=4)], CPU)
    assert plan.kind == SwitchKind.COLD and plan.evict == () and "next to a" in plan.reason


def test_cpu_stops_the_least_recently_used_when_it_does_not_fit() -> None:
    others = [m("a", S.READY, need=5, used=10), m("c", S.READY, need=4, used=5)]
    plan = plan_switch(m("b", need=5), others, CPU)
    assert plan.evict == (Eviction("c", Evict.STOP),) and plan.fits


def test_gpu_puts_the_other_to_sleep_and_wakes_a_sleeping_target() -> None:
    plan = plan_switch(m("b", S.SLEEPING, need=70, residue=GIB), [m("a", S.READY, need=70, can_sleep=True,
                                                                   residue=GIB)], GPU)  # fmt: skip
    assert plan.kind == SwitchKind.SLEEPING and plan.evict == (Eviction("a", Evict.SLEEP),)


def test_sleeping_engines_are_stopped_when_their_residue_is_in_the_way() -> None:
    others = [m("a", S.SLEEPING, need=70, residue=8 * GIB), m("c", S.READY, need=70, can_sleep=True, residue=8 * GIB)]
    plan = plan_switch(m("b", need=70), others, GPU)
    # c goes to sleep (70 -> 8 GiB), still 6 GiB short: the older sleeper a is stopped as well.
    assert plan.evict == (Eviction("c", Evict.SLEEP), Eviction("a", Evict.STOP)) and plan.fits


def test_a_sleepers_kept_weights_are_released_before_any_engine_is_stopped() -> None:
    """manager.sleep_keeps_weights: a (asleep, 1 GiB residue, 15 GiB of weights kept) and c awake. b needs 70 of 80:
    c sleeps (frees 69), still 4 short, so a's kept weights are released (15), not a stopped. Needing more than
    that too (79), a is stopped after all: its release becomes a stop, and what it frees counts once."""
    a = m("a", S.SLEEPING, need=60, used=1, residue=GIB, kept=15 * GIB)
    c = m("c", S.READY, need=60, used=5, can_sleep=True, residue=GIB)
    plan = plan_switch(m("b", need=70), [a, c], GPU)
    assert plan.evict == (Eviction("c", Evict.SLEEP), Eviction("a", Evict.RELEASE)) and plan.fits
    plan = plan_switch(m("b", need=79), [a, c], GPU)
    assert plan.evict == (Eviction("c", Evict.SLEEP), Eviction("a", Evict.STOP)) and plan.fits
    assert held(a, GPU) == 16 * GIB  # the residue and the kept weights


def test_unknown_need_never_shares_the_machine() -> None:
    plan = plan_switch(m("b", need=None), [m("a", S.READY, need=1)], CPU)
    assert plan.evict == (Eviction("a", Evict.STOP),) and plan.fits


def test_too_big_for_the_machine_is_reported_not_attempted() -> None:
    plan = plan_switch(m("b", need=20), [], CPU)
    assert not plan.fits and "short of" in plan.reason


def test_largest_first_order() -> None:
    others = [m("small", S.READY, need=2, used=1), m("big", S.READY, need=6, used=9)]
    plan = plan_switch(m("b", need=3), others, CPU, EvictionOrder.LARGEST)
    assert plan.evict == (Eviction("big", Evict.STOP),)


@pytest.mark.parametrize(("busy", "age", "idle", "expected"), [
    (1, 100, 100, False),  # serving: never
    (0, 5, 0.5, False),  # young and in use: keeps its residency
    (0, 5, 10, True),  # young but quiet: may go
    (0, 30, 0.5, True),  # residency over
])  # fmt: skip
def test_residency_turn(busy: int, age: float, idle: float, expected: bool) -> None:
    now = 1000.0
    view = ModelView("a", S.READY, GIB, last_used=now - idle, ready_since=now - age, busy=busy)
    turn = Residency(Rules(min_residency_s=20, quiet_s=2, max_wait_s=4)).turn(view, now, 0.0, 0.0)
    assert turn.may_evict is expected
    assert turn.close is (age >= 20)


def test_idle_policy() -> None:
    ready = ModelView("a", S.READY, GIB, last_used=0, can_sleep=True)
    assert idle_action(ready, 100, 60, 600, sleep_supported=True) == IdleAction.SLEEP
    assert idle_action(ready, 100, 60, 600, sleep_supported=False) == IdleAction.STOP
    assert idle_action(ready, 30, 60, 600, True) == IdleAction.NONE
    assert idle_action(ModelView("a", S.READY, GIB, busy=1), 1000, 60, 600, True) == IdleAction.NONE
    asleep = ModelView("a", S.SLEEPING, GIB, last_used=0)
    assert idle_action(asleep, 700, 60, 600, True) == IdleAction.STOP
    assert idle_action(ready, 10**6, 0, 0, True) == IdleAction.NONE  # ttl 0: never


def test_restart_backoff_then_give_up() -> None:
    assert [restart_delay(n, 3, 2) for n in range(4)] == [2, 4, 8, None]


def test_sleep_verified_by_memory_drop() -> None:
    assert sleep_freed_enough(70 * GIB, 2 * GIB, 68 * GIB, 0.5)
    assert not sleep_freed_enough(70 * GIB, 69 * GIB, 68 * GIB, 0.5)
    assert not sleep_freed_enough(None, None, GIB, 0.5)  # no NVML: not verified -> stop


def test_state_machine_table() -> None:
    assert set(ALLOWED) == set(ModelState)
    check_move("a", S.STOPPED, S.STARTING)
    check_move("a", S.READY, S.READY)  # detail update
    with pytest.raises(TransitionError):
        check_move("a", S.STOPPED, S.READY)
    with pytest.raises(TransitionError):
        check_move("a", S.SLEEPING, S.READY)  # a wake goes through starting (health checked)


def test_a_two_gpu_host_budgets_one_gpu_and_the_second_engine_puts_the_first_to_sleep() -> None:
    """The lent x2's switch bench (2026-11-29): capacity summed over 2 H200s let a 0.7-of-a-GPU 3B start beside the
    awake 0.7-of-a-GPU 8B, and vLLM refused it on GPU 0 (every engine counts its GPUs from the first)."""
    from types import SimpleNamespace

    from stack.config.sections.manager import ManagerConfig
    from stack.manager.memory import capacity_bytes

    h200 = SimpleNamespace(memory_total=int(139.8 * GIB))
    hardware = SimpleNamespace(gpus=[h200, h200])
    total = capacity_bytes(ManagerConfig(), hardware)
    assert total == h200.memory_total
    need = 0.7 * 139.8
    plan = plan_switch(m("llama-3b", need=need), [m("llama-8b", S.READY, need=need, can_sleep=True)],
                       Capacity(total, sleep_supported=True))  # fmt: skip
    assert plan.evict == (Eviction("llama-8b", Evict.SLEEP),) and plan.fits
    assert capacity_bytes(ManagerConfig(memory_budget_gib=100), hardware) == 100 * GIB  # the user's budget, as given


def test_models_pinned_to_different_gpus_stay_resident_together_and_one_sharing_a_gpu_evicts() -> None:
    on_gpu = lambda *ids: frozenset(ids)  # noqa: E731
    one_gpu = Capacity(int(139.8 * GIB), sleep_supported=True)
    need = 0.9 * 139.8
    awake = m("llama-8b", S.READY, need=need, can_sleep=True, gpus=on_gpu(0))
    apart = plan_switch(m("qwen-7b", need=need, gpus=on_gpu(1)), [awake], one_gpu)
    assert apart.evict == () and apart.fits and "on an empty machine" in apart.reason
    beside = plan_switch(m("qwen-7b", need=need, gpus=on_gpu(0, 1)), [awake], one_gpu)  # tensor parallel over both
    assert beside.evict == (Eviction("llama-8b", Evict.SLEEP),)
    unpinned = plan_switch(m("qwen-7b", need=need), [awake], one_gpu)  # counts from GPU 0, as vLLM does
    assert unpinned.evict == (Eviction("llama-8b", Evict.SLEEP),)


@pytest.mark.parametrize(
    ("value", "count", "gpus"),
    [("1", 1, {1}), ("2,3", 2, {2, 3}), (" 2, 3 ", 1, {2}), ("", 1, None), ("GPU-c834433d", 1, None),
     ("MIG-1/2/3", 1, None), ("0,x", 1, None)],
)  # fmt: skip
def test_an_engines_pinned_gpus_are_read_from_its_cuda_visible_devices(value: str, count: int, gpus) -> None:
    from stack.manager.memory import pinned_gpus

    got = pinned_gpus({"CUDA_VISIBLE_DEVICES": value} if value else {}, count)
    assert got == (None if gpus is None else frozenset(gpus))
