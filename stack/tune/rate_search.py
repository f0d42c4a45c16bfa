"""Goodput: the highest open-loop request rate at which an SLO still holds, found by bisection.

A probe loads the engine at an offered rate (Poisson arrivals, or gamma with a burstiness) with enough
requests for a stable p95, after warm-up requests that are kept out of its figures (vLLM's own
`--num-warmups`). The search first measures the capacity (every request at once), brackets the SLO's edge
from there (below it when the burst missed the SLO, above it when it met it: a rate above counts only if
the engine served more than under the burst), bisects to a tolerance, and repeats the winning rate: a rate
counts only when every measurement of it met the SLO. The search is a pure function of its probes' verdicts, so a
resumed search replays the probes measured earlier instead of measuring them again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from stack.config.slo import Clause, evaluate
from stack.errors import StackError
from stack.load.scenario import TuneSettings

Role = Literal["capacity", "probe", "repeat"]
INF = math.inf


@dataclass
class SearchSettings:
    """From the scenario's `tune:` section (stack.load.scenario.TuneSettings)."""

    burstiness: float = 1.0  # 1: Poisson arrivals; < 1 burstier, > 1 more even (vllm bench serve's gamma)
    min_requests: int = 200  # per probe: p95 from at least this many requests
    probe_s: float = 20.0  # per probe: at least this many seconds of arrivals at the offered rate
    max_requests: int = 2000
    warmups: int = 8  # sent before each probe, excluded from its figures
    tolerance: float = 0.1  # stop bisecting when the bracket is this narrow (relative)
    max_probes: int = 8  # besides the repeats
    repeats: int = 1  # extra measurements of the winning rate
    rate_start: float | None = None  # none: start from the measured capacity
    rate_min: float = 0.05
    # A probe counts only where the engine kept pace: served >= this share of the offered rate over the probe
    # (its arrivals plus the drain). A short probe above what the engine sustains can still meet a TTFT SLO,
    # the excess piling up in a running batch that grows (TPOT rising) until the KV cache fills; a longer
    # probe would miss it. On an H200 (8B, 1024/128, 10 s probes) sustained rates served 0.91-0.92 of the
    # offer, overloaded ones 0.70-0.80 while their p95 TTFT still met 800 ms.
    keep_pace: float = 0.85
    # Above a rate that held, the next offer is this much higher (below one that failed: half). An offer
    # counts only where the engine served keep_pace of it, and no engine serves much more than the burst
    # did: with keep_pace 0.85 nothing past ~1.2x the burst's rate can count. 1.5 (this search's first
    # step) was a wasted probe on all six H200 candidates (8B, 2026-11-24), and the longest: overloaded,
    # its drain the slowest.
    grow: float = 1.25

    @classmethod
    def of(cls, tune: TuneSettings) -> SearchSettings:
        """The search a scenario's `tune:` section asks for."""
        return cls(
            burstiness=tune.burstiness, min_requests=tune.min_requests, probe_s=tune.probe_s,
            max_requests=tune.max_requests, warmups=8 if tune.warmups is None else tune.warmups,
            tolerance=tune.tolerance, max_probes=tune.max_probes, repeats=tune.repeats, rate_start=tune.rate_start,
            rate_min=tune.rate_min, keep_pace=tune.keep_pace, grow=tune.grow)

    def requests_for(self, rate: float) -> int:
        if math.isinf(rate):
            return self.min_requests
        return max(self.min_requests, min(self.max_requests, math.ceil(rate * self.probe_s)))


@dataclass
class Point:
    rate: float  # offered requests/s; inf = every request at once (capacity)
    role: Role
    requests: int
    met: bool
    metrics: dict[str, Any]
    seconds: float = 0.0
    misses: list[str] = field(default_factory=list)  # the clauses it missed, described

    @property
    def achieved_rps(self) -> float:
        return float(self.metrics.get("requests_per_s") or 0.0)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["rate"] = None if math.isinf(self.rate) else self.rate
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Point:
        rate = data.get("rate")
        return cls(**{**data, "rate": INF if rate is None else float(rate)})


@dataclass
class SearchResult:
    goodput_rps: float  # offered rate at which the SLO held (every measurement of it); 0: not even rate_min
    points: list[Point]
    best: Point | None  # the last measurement at the goodput rate (its figures are the candidate's)
    note: str


class ProbeFailed(StackError):
    """No request of a probe was answered (the engine died, or never served): the candidate fails."""


def answered_counts(metrics: dict[str, float | None], which: str, hint: str) -> tuple[int, int]:
    """(failed, ok) of a vllm bench serve run; ProbeFailed when it answered none: vllm bench serve still
    reports then (zero latencies, exit 0), which must never read as a verdict on the SLO."""
    failed, ok = int(metrics.get("errors") or 0), int(metrics.get("ok") or 0)
    if failed and not ok:
        raise ProbeFailed(f"every request of {which} failed ({failed}): the engine answered none", hint=hint)
    return failed, ok


class BudgetExhausted(StackError):
    """The time budget ends before the next probe: the points so far are kept for the resumed search."""

    def __init__(self, points: list[Point]) -> None:
        super().__init__("time budget reached during a rate search")
        self.points = points


Probe = Callable[[float, int, int], dict[str, Any]]  # (rate, requests, seed) -> summary metrics


def round_rate(rate: float) -> float:
    """3 significant figures: readable, and what a resumed search matches earlier probes by."""
    if math.isinf(rate) or rate <= 0:
        return rate
    return float(f"{rate:.3g}")


class _Replay:
    """Earlier points, handed back in order while the search asks for the same (rate, role) again."""

    def __init__(self, earlier: Sequence[Point]) -> None:
        self._it: Iterator[Point] = iter(list(earlier))
        self.live = True

    def take(self, rate: float, role: Role) -> Point | None:
        if not self.live:
            return None
        nxt = next(self._it, None)
        if nxt is not None and nxt.role == role and (nxt.rate == rate or (math.isinf(nxt.rate) and math.isinf(rate))):
            return nxt
        self.live = False  # the search went elsewhere: everything after is measured afresh
        return None


def search_goodput(probe: Probe, clauses: Sequence[Clause], s: SearchSettings, earlier: Sequence[Point] = (),
                   deadline: float | None = None,
                   on_point: Callable[[Point, list[Point]], None] = lambda _p, _all: None) -> SearchResult:
    """Bisection on the offered rate; `deadline` (time.monotonic()) stops it before a probe that would not fit.
    `on_point(point, every point so far)` after each new measurement (replayed ones included in the list)."""
    points: list[Point] = []
    replay = _Replay(earlier)
    last_overhead = [15.0]  # seconds a probe costs besides its arrivals (bench start, warm-up, drain)
    ceiling = [INF]  # where the burst met the SLO: its served rate, which a faster offer must beat

    def measure(rate: float, role: Role) -> Point:
        rate = round_rate(rate)
        again = replay.take(rate, role)
        if again is not None:
            points.append(again)
            return again
        n = s.requests_for(rate)
        if deadline is not None:
            arrivals = 0.0 if math.isinf(rate) else n / rate
            if time.monotonic() + arrivals + last_overhead[0] > deadline:
                raise BudgetExhausted(points)
        started = time.monotonic()
        metrics = probe(rate, n, len(points) + 1)  # the seed: new prompts each probe (no prefix-cache hits)
        took = time.monotonic() - started
        last_overhead[0] = max(5.0, took - (0.0 if math.isinf(rate) else n / rate))
        which = "the capacity probe (all at once)" if math.isinf(rate) else f"the probe at {rate:g} req/s"
        failed, ok = answered_counts(metrics, which, "read that probe's *.bench.log and the engine's log")
        checks = evaluate(clauses, metrics)
        misses = [r.describe() for r in checks if not r.met]
        if failed:  # a request that failed was not served within the SLO, whatever the others' latencies
            misses.insert(0, f"{failed} of {failed + ok} requests failed")
        served = float(metrics.get("requests_per_s") or 0.0)
        if not math.isinf(rate) and served < s.keep_pace * rate:
            misses.append(f"served {served:.4g} req/s of {rate:g} offered (< {s.keep_pace:g}x): requests piled up, "
                          "not a rate the engine sustains")
        elif rate > ceiling[0] and served <= ceiling[0]:
            # Offered past what the burst served and served no more: the engine did not keep pace, whatever a
            # short probe's latencies say (a generous SLO would otherwise climb without end).
            misses.append(f"served {served:.4g} req/s of {rate:g} offered, "
                          f"no more than all at once ({ceiling[0]:.4g}): not keeping pace")
        point = Point(rate, role, n, not misses, metrics, round(took, 1), misses)
        points.append(point)
        on_point(point, list(points))
        return point

    def passing_everywhere(rate: float) -> bool:
        return all(p.met for p in points if p.rate == rate)

    first_rate = s.rate_start
    if first_rate is None:
        cap = measure(INF, "capacity")
        # Every candidate's goodput is an open-loop rate, bracketed and repeated, even where the burst met the
        # SLO: a burst's rate counts its drain tail, so scoring it against another candidate's offered rate
        # would compare two different things. The burst only gives the first rate to offer.
        first_rate = cap.achieved_rps or 1.0
        if cap.met:
            ceiling[0] = cap.achieved_rps
    lo: float | None = None
    hi: float | None = None
    r = round_rate(first_rate)
    probes = 0
    while probes < s.max_probes:  # bracket: grow while it passes, halve while it fails
        p = measure(r, "probe")
        probes += 1
        if p.met:
            lo = r
            if hi is not None:
                break
            r = round_rate(r * s.grow)
        else:
            hi = r
            if lo is not None:
                break
            r = round_rate(r / 2)
            if r < s.rate_min:
                return SearchResult(0.0, points, None, f"the SLO fails even at {points[-1].rate:g} req/s")
    while True:
        while lo is not None and hi is not None and hi / lo - 1 > s.tolerance and probes < s.max_probes:
            mid = round_rate((lo + hi) / 2)
            if mid in (lo, hi):
                break
            p = measure(mid, "probe")
            probes += 1
            lo, hi = (mid, hi) if p.met else (lo, mid)
        if lo is None:
            return SearchResult(0.0, points, None, f"no rate down to {points[-1].rate:g} req/s meets the SLO")
        for _ in range(s.repeats):
            if not measure(lo, "repeat").met:
                break
        if passing_everywhere(lo):
            best = [p for p in points if p.rate == lo][-1]
            edge = f"fails at {hi:g}" if hi is not None else f"not tried above {lo:g} (probe limit)"
            return SearchResult(lo, points, best, f"holds at {lo:g} req/s (measured {sum(p.rate == lo for p in points)}"
                                f"x), {edge}")
        # The repeat failed: that rate does not count; the highest rate below it that always passed does.
        hi = lo
        below = [p.rate for p in points if p.rate < lo and passing_everywhere(p.rate)]
        lo = max(below) if below else None
        if lo is None:
            r = round_rate(hi / 2)
            while probes < s.max_probes and r >= s.rate_min:
                probes += 1
                if measure(r, "probe").met:
                    lo = r
                    break
                hi, r = r, round_rate(r / 2)
            if lo is None:
                return SearchResult(0.0, points, None, "no rate met the SLO on every measurement")
        # Ends: each round either returns or lowers `lo` to an earlier, always-passing rate.
