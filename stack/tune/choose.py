"""The rule `vstack tune` picks by: of the candidates that meet the SLO, the highest score (goodput: the
highest request rate at which the SLO held; capacity mode: output tokens/s); when none does, the one
closest to meeting it (smallest summed relative shortfall), reported as such. A candidate whose measured
run lost requests never meets the SLO."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stack.config.slo import Clause, ClauseResult, all_met, distance, evaluate


@dataclass
class Measured:
    """One candidate's outcome: metrics when it ran, an error when it did not start or measure."""

    key: str
    label: str
    overrides: dict[str, Any]
    metrics: dict[str, Any] | None = None
    error: str | None = None
    numerics: str | None = None  # why its answers may differ from the baseline's (quantization, ...), or None
    points: list[dict[str, Any]] | None = None  # goodput: every probe of the rate search
    answers: list[str] | None = None  # the fixed prompts' answers at temperature 0 (real weights only)
    answer_tokens: list[list[str]] | None = None  # the same answers as the engine's tokens
    paused: bool = False  # a time budget cut its search short: the next call resumes it

    @property
    def ok(self) -> bool:
        return self.metrics is not None and self.error is None

    @property
    def dropped(self) -> int:
        """Requests that failed in the run its figures come from (a goodput search keeps no such point)."""
        return int((self.metrics or {}).get("errors") or 0)

    @property
    def throughput(self) -> float:
        value = (self.metrics or {}).get("output_tokens_per_s")
        return float(value) if value is not None else 0.0

    @property
    def goodput(self) -> bool:
        return "goodput_rps" in (self.metrics or {})

    @property
    def score(self) -> float:
        """Goodput (req/s within the SLO) when the search ran, else output tokens/s."""
        if self.goodput:
            return float((self.metrics or {}).get("goodput_rps") or 0.0)
        return self.throughput

    def describe_score(self) -> str:
        return f"goodput {self.score:,.2f} req/s" if self.goodput else f"{self.throughput:,.1f} tok/s"


@dataclass
class Choice:
    winner: Measured | None
    meets_slo: bool
    checks: dict[str, list[ClauseResult]]  # key -> clause results, for every candidate that ran
    reason: str


def meets(m: Measured, checks: Sequence[ClauseResult]) -> bool:
    """The SLO held: every clause, a goodput search found a rate, and the measured run lost no request (a
    failed request was not served within the SLO, whatever the latencies of the answered ones)."""
    return all_met(checks) and (not m.goodput or m.score > 0) and not m.dropped


def choose(measured: Sequence[Measured], clauses: Sequence[Clause], refused: dict[str, str] | None = None
           ) -> Choice:
    """`refused`: candidates the quality guard keeps out (key -> why); they are measured and shown, never picked."""
    refused = refused or {}
    ran = [m for m in measured if m.ok]
    checks = {m.key: evaluate(clauses, m.metrics or {}) for m in ran}
    if not ran:
        return Choice(None, False, checks, "no candidate could be measured")
    eligible = [m for m in ran if m.key not in refused]
    kept_out = [m for m in ran if m.key in refused]
    if not eligible:
        return Choice(None, False, checks, "every measured candidate failed the quality guard: "
                      + "; ".join(f"{m.label}: {refused[m.key]}" for m in kept_out))
    # Goodput: a candidate meets the SLO when some rate did (its figures are that rate's).
    passing = [m for m in eligible if meets(m, checks[m.key])]
    if passing:
        best = max(passing, key=lambda m: (m.score, m.throughput))
        others = len(passing) - 1
        what = "goodput" if best.goodput else "output throughput"
        why = (f"highest {what} ({best.describe_score()}) of the {len(passing)} candidates "
               f"that meet the SLO" if others else "the only candidate that meets the SLO")
        return Choice(best, True, checks, why + _quality_note(best, kept_out, checks, refused))
    # Nobody meets it: the smallest shortfall wins; throughput breaks ties.
    best = min(eligible, key=lambda m: (m.dropped > 0, distance(checks[m.key]), -m.throughput))
    missed = "; ".join([f"{best.dropped} requests failed"] * bool(best.dropped)
                       + [r.describe() for r in checks[best.key] if not r.met])
    return Choice(best, False, checks, f"no candidate meets the SLO; closest: {best.label} ({missed})"
                  + _quality_note(best, kept_out, checks, refused))


def _quality_note(best: Measured, kept_out: list[Measured], checks: dict[str, list[ClauseResult]],
                  refused: dict[str, str]) -> str:
    """What the quality guard changed: the candidates it kept out that would have scored higher."""
    better = [m for m in kept_out
              if meets(m, checks[m.key]) and (m.score, m.throughput) > (best.score, best.throughput)]
    if not better:
        return ""
    return "; not chosen for their answers: " + "; ".join(
        f"{m.label} ({m.describe_score()}: {refused[m.key]})" for m in better)
