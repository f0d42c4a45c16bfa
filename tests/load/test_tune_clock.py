"""The time budget's estimate of the next candidate (stack.tune.time_budget): held and cold starts apart.

Figures are the 8B tune's on the lent H200 (2026-11-24, tune.json): a plain average over both kinds made the
first call stop after 2 candidates with room for a third held one.
"""

from __future__ import annotations

import pytest

from stack.tune.time_budget import FIRST_CANDIDATE_S, CandidateClock


def test_nothing_timed_yet_asks_for_the_first_candidate_allowance() -> None:
    clock = CandidateClock()
    assert clock.need_s(held=False) == FIRST_CANDIDATE_S
    assert clock.need_s(held=True) == FIRST_CANDIDATE_S


def test_a_held_start_is_estimated_from_held_starts_only() -> None:
    clock = CandidateClock()
    clock.record(130.6, 71.4, held=False)  # the baseline: cold, first engine on the machine
    clock.record(77.7, 68.9, held=True)
    clock.record(49.1, 69.6, held=True)
    assert clock.start_s(held=True) == pytest.approx((77.7 + 49.1) / 2)
    assert clock.start_s(held=False) == pytest.approx(130.6)
    assert clock.rest_s() == pytest.approx((71.4 + 68.9 + 69.6) / 3)
    assert clock.need_s(held=True) == pytest.approx(63.4 + 69.966, abs=0.01)
    # The old plain average (what the first call was checked against) was larger than the held estimate
    # by more than the 131 s that call had left minus the held candidate's real 130 s.
    plain = (130.6 + 71.4 + 77.7 + 68.9 + 49.1 + 69.6) / 3
    assert plain - clock.need_s(held=True) > 20


def test_a_held_start_nobody_timed_counts_as_a_cold_one() -> None:
    clock = CandidateClock()
    clock.record(93.4, 70.0, held=False)
    assert clock.need_s(held=True) == pytest.approx(163.4)
    assert clock.need_s(held=False) == pytest.approx(163.4)


def test_a_cold_start_nobody_timed_counts_as_the_longest_held_one_and_negative_parts_as_zero() -> None:
    clock = CandidateClock()
    clock.record(60.0, 80.0, held=True)
    clock.record(-1.0, -5.0, held=True)  # a resumed state's odd figure never counts below zero
    assert clock.start_s(held=False) == pytest.approx(60.0)
    assert clock.start_s(held=True) == pytest.approx(30.0)
    assert clock.rest_s() == pytest.approx(40.0)
