"""Service-level objectives: `p95_ttft_ms<800`, `output_tokens_per_s>=50`, parsed, checked and compared.

One clause is `METRIC OP NUMBER`. The metrics are the keys of a load summary (stack.load.summary):
latency percentiles `p{50,90,95,99}_{ttft,itl,tpot,e2e}_ms`, and `output_tokens_per_s`, `requests_per_s`,
`error_rate`. Kept free of other stack imports: the config schema validates profile SLOs with it.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

PERCENTILES = (50, 90, 95, 99)
LATENCIES = ("ttft", "itl", "tpot", "e2e")
RATES = ("output_tokens_per_s", "requests_per_s", "error_rate")
METRICS = tuple(f"p{p}_{m}_ms" for m in LATENCIES for p in PERCENTILES) + RATES
# Names people type for the same thing (vllm bench serve says e2el, others say tok_s).
ALIASES = {"tok_s": "output_tokens_per_s", "tokens_per_s": "output_tokens_per_s", "rps": "requests_per_s",
           "req_s": "requests_per_s", "errors": "error_rate"}
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt,
}
_CLAUSE = re.compile(r"^\s*([A-Za-z0-9_]+)\s*(<=|>=|<|>)\s*([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*$")


class SloError(ValueError):
    """A clause that does not parse; the message names the clause and what is allowed."""


@dataclass(frozen=True)
class Clause:
    metric: str
    op: str
    limit: float

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.limit:g}"

    @property
    def upper_bound(self) -> bool:
        return self.op in ("<", "<=")

    def met(self, value: float | None) -> bool:
        return value is not None and not math.isnan(value) and _OPS[self.op](value, self.limit)

    def shortfall(self, value: float | None) -> float:
        """How far a value misses the limit, relative to it (0 when met; inf when not measured)."""
        if value is None or math.isnan(value):
            return math.inf
        if self.met(value):
            return 0.0
        scale = abs(self.limit) or 1.0
        return abs(value - self.limit) / scale


def _metric_name(raw: str) -> str:
    name = raw.lower().replace("e2el", "e2e")
    name = ALIASES.get(name, name)
    if name not in METRICS:
        import difflib

        close = difflib.get_close_matches(name, METRICS, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SloError(f"unknown SLO metric {raw!r}{hint} (known: p50/p90/p95/p99 of ttft, itl, tpot, e2e as "
                       f"e.g. p95_ttft_ms; and {', '.join(RATES)})")
    return name


def parse_clause(text: str) -> Clause:
    match = _CLAUSE.match(text)
    if not match:
        raise SloError(f"SLO clause {text!r} does not parse; write METRIC OP NUMBER, e.g. 'p95_ttft_ms<800' "
                       "or 'output_tokens_per_s>=50' (OP: <, <=, >, >=)")
    metric, op, number = match.groups()
    return Clause(_metric_name(metric), op, float(number))


def parse_slo(spec: str | Iterable[str] | None) -> list[Clause]:
    """'p95_ttft_ms<800, error_rate<0.01' or ['p95_ttft_ms<800', ...] -> clauses (commas or `and` join)."""
    if spec is None:
        return []
    items = [spec] if isinstance(spec, str) else list(spec)
    parts = [p for item in items for p in re.split(r",|\band\b|&&", item) if p.strip()]
    return [parse_clause(p) for p in parts]


@dataclass(frozen=True)
class ClauseResult:
    clause: Clause
    value: float | None
    met: bool
    shortfall: float

    def describe(self) -> str:
        shown = "not measured" if self.value is None or math.isnan(self.value) else f"{self.value:.4g}"
        verdict = "pass" if self.met else f"FAIL (off by {self.shortfall:.0%})"
        return f"{self.clause}: {shown} -> {verdict}"


def evaluate(clauses: Iterable[Clause], metrics: Mapping[str, float | None]) -> list[ClauseResult]:
    results = []
    for c in clauses:
        value = metrics.get(c.metric)
        results.append(ClauseResult(c, value, c.met(value), c.shortfall(value)))
    return results


def all_met(results: Iterable[ClauseResult]) -> bool:
    return all(r.met for r in results)


def distance(results: Iterable[ClauseResult]) -> float:
    """How far from meeting the whole SLO: the sum of relative shortfalls (0 = met). Ranks near misses."""
    return sum(r.shortfall for r in results)
