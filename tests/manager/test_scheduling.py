"""The switch schedulers (stack.config.switch_schedulers): their rules with plain values, then the grouped one's bound
on waiting with the real ModelManager replaying a mixed two-model Poisson trace over stand-in engines
(bench.harness.standin_engine: a switch delay and nothing behind it; the decision logic, not an engine)."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from pydantic import ValidationError

from bench.harness.trace_replay import poisson_trace, replay_on_manager, standin_manager
from stack.config.sections.manager import ManagerConfig
from stack.config.switch_schedulers import SCHEDULERS, Grouped, Residency, Rules
from stack.manager.policy import ModelView
from stack.manager.states import ModelState as S

RULES = Rules(min_residency_s=20, quiet_s=2, max_wait_s=4)


def view(busy: int = 1, ready_since: float = 95.0, last_used: float = 99.9) -> ModelView:
    return ModelView("a", S.READY, 1, last_used=last_used, ready_since=ready_since, busy=busy)


def pair(turn) -> tuple[bool, bool]:
    return turn.may_evict, turn.close


def test_residency_holds_a_busy_model_for_its_residency_whatever_waits() -> None:
    assert pair(Residency(RULES).turn(view(), 100.0, waited_s=60.0, switch_s=0)) == (False, False)
    assert pair(Residency(RULES).turn(view(busy=0, ready_since=70), 100.0, 60.0, 0)) == (True, True)


def test_grouped_holds_a_busy_model_until_the_oldest_waiting_request_is_due() -> None:
    # The waiting group is smaller than the one served (1 request vs 3 in flight): due at max_wait_s.
    assert pair(Grouped(RULES).turn(view(busy=3), 100.0, waited_s=3.9, switch_s=0.5, waiting=1)) == (False, False)
    assert pair(Grouped(RULES).turn(view(busy=3), 100.0, waited_s=4.0, switch_s=0.5, waiting=1)) == (False, True)
    # ... at least as big: due once it has waited what the switch costs.
    assert pair(Grouped(RULES).turn(view(busy=3), 100.0, waited_s=0.4, switch_s=0.5, waiting=3)) == (False, False)
    assert pair(Grouped(RULES).turn(view(busy=3), 100.0, waited_s=0.5, switch_s=0.5, waiting=3)) == (False, True)
    # A slow switch (a cold start) is never thrashed: nobody is due before it would have paid for itself.
    assert pair(Grouped(RULES).turn(view(busy=3), 100.0, waited_s=30, switch_s=45, waiting=5)) == (False, False)
    assert pair(Grouped(RULES).turn(view(busy=0), 100.0, 4.0, 0.5, 1)) == (True, True)  # due, and nothing in flight
    assert pair(Grouped(RULES).turn(view(busy=0, last_used=90.0), 100.0, 0.0, 0.0)) == (True, False)  # idle: goes
    assert pair(Grouped(RULES).turn(view(busy=0), 100.0, 0.0, 0.0)) == (False, False)  # between two of its requests
    asleep = ModelView("a", S.SLEEPING, 1)
    assert Grouped(RULES).turn(asleep, 100.0, 0.0, 0.0).may_evict


def test_each_policy_is_one_class_of_the_table_that_the_configuration_lists() -> None:
    """`manager.scheduler` offers exactly the table's policies, and a switch waits for the models in its way
    what the chosen policy holds them (residency: min_residency_s; grouped: max_wait_s) plus the drain."""
    assert list(SCHEDULERS) == ["residency", "grouped"]
    with pytest.raises(ValidationError, match="'residency' or 'grouped'"):
        ManagerConfig(scheduler="fifo")
    assert SCHEDULERS["residency"](RULES).wait_limit_s(60.0) == 80.0
    assert SCHEDULERS["grouped"](RULES).wait_limit_s(60.0) == 64.0


def test_the_wait_until_a_turn_for_the_estimate() -> None:
    assert Grouped(RULES).turn_wait_s(view(), 100.0, waited_s=1.0) == pytest.approx(3.0)
    assert Residency(RULES).turn_wait_s(view(), 100.0, waited_s=1.0) == pytest.approx(15.0)
    assert Residency(RULES).turn_wait_s(view(busy=0, last_used=99.0), 100.0, 0.0) == pytest.approx(1.0)


def test_grouped_serves_every_request_within_its_bound() -> None:
    """70/30 Poisson at 3 req/s for 10 s; switches of 0.3 s, answers of 0.6 s. No request waits for its model's
    turn longer than max(max_wait_s, switch) + the drain of the other model's requests in flight + one switch (+ the
    manager's 0.25 s re-check and scheduling slack), and never more switches than the trace changes models."""
    trace = poisson_trace(rate=3.0, duration_s=10, mix={"a": 0.7, "b": 0.3}, seed=3)
    settings = ManagerConfig(scheduler="grouped", max_wait_s=1.0, quiet_s=0.5, queue_timeout_s=60, idle_ttl_s=0,
                             restart_max=0)  # fmt: skip
    manager = standin_manager(["a", "b"], settings, switch_s=0.3)
    served = asyncio.run(replay_on_manager(manager, trace, service_s=0.6, prefill_s=0.05))
    assert all(s.ttft_s is not None for s in served)
    bound = max(settings.max_wait_s, 0.3) + 0.6 + 0.3 + 0.05 + 0.6  # wait + drain + switch + prefill + slack
    worst = max(s.ttft_s for s in served)
    assert worst <= bound, f"a request waited {worst:.2f} s > {bound:.2f} s"
    changes = sum(1 for x, y in itertools.pairwise(trace) if x.model != y.model)
    assert 2 <= len(manager.history) <= changes + 1  # + the first start
