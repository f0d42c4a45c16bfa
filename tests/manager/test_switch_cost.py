"""How long until a model is awake (stack.manager.switch_cost): what the gateway's TTFT estimate adds."""

from __future__ import annotations

import pytest

from stack.config.switch_schedulers import Grouped, Residency, Rules
from stack.manager.policy import ModelView, SwitchKind
from stack.manager.states import ModelState as S
from stack.manager.switch_cost import expected_switch_s, room_wait_s, typical_switch_s

HISTORY = [
    {"model": "a", "kind": "sleeping", "seconds": 0.6, "phases": {"wait_room_s": 0.1}},
    {"model": "a", "kind": "sleeping", "seconds": 9.5, "phases": {"wait_room_s": 9.0}},  # waited for b's residency
    {"model": "a", "kind": "sleeping", "seconds": 0.7},
    {"model": "a", "kind": "cold", "seconds": 40.0},
    {"model": "b", "kind": "sleeping", "seconds": 3.0},
]


def test_typical_switch_is_the_median_of_its_own_switches_without_the_wait_for_room() -> None:
    assert typical_switch_s(HISTORY, "a", SwitchKind.SLEEPING) == pytest.approx(0.5)
    assert typical_switch_s(HISTORY, "a", SwitchKind.COLD) == 40.0
    assert typical_switch_s(HISTORY, "c", SwitchKind.COLD) is None


def test_expected_by_state() -> None:
    def exp(state, detail="", since=0.0, now=0.0, sleeps=True, wait=0.0):
        return expected_switch_s(state, detail, since, now, sleeps, HISTORY, "a", wait)

    assert exp(S.READY) == 0.0
    assert exp(S.SLEEPING, wait=2.0) == pytest.approx(2.5)
    assert exp(S.STOPPED) == 40.0
    assert exp(S.SLEEPING, sleeps=False) == 40.0  # a sleeping engine that cannot wake (no tier): cold
    assert exp(S.STARTING, "waking up (level 1)", since=10.0, now=10.2) == pytest.approx(0.3)
    assert exp(S.STARTING, "cold start, pid 12", since=10.0, now=70.0) == 0.0  # late: any moment now
    assert exp(S.FAILED) is None
    assert expected_switch_s(S.SLEEPING, "", 0, 0, True, [], "a") is None  # never switched: unknown


def test_the_wait_for_the_models_it_evicts_follows_the_scheduler() -> None:
    busy = ModelView("b", S.READY, 1, last_used=99.0, ready_since=90.0, busy=1)
    idle = ModelView("c", S.READY, 1, last_used=95.0, ready_since=95.0, busy=0)
    rules = Rules(min_residency_s=20, quiet_s=2, max_wait_s=4)

    def wait(evicted, scheduler, waited=0.0):
        return room_wait_s([busy, idle], evicted, 100.0, scheduler(rules), waited)

    assert wait(["b"], Residency) == pytest.approx(10.0)  # b's residency
    assert wait(["b"], Grouped, waited=1.0) == pytest.approx(3.0)  # the oldest request's max wait
    assert wait(["c"], Residency) == 0.0 and wait(["c"], Grouped) == 0.0  # idle for 5 s
    assert wait([], Residency) == 0.0
