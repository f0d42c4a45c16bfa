"""From request records to the numbers an SLO is written in: percentiles, throughput, errors, over time."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stack.config.slo import LATENCIES, PERCENTILES
from stack.load.measured_requests import RequestRecord


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _latencies(records: Sequence[RequestRecord]) -> dict[str, list[float]]:
    ok = [r for r in records if r.ok]
    return {
        "ttft": [r.ttft_ms for r in ok if r.ttft_ms is not None],
        "itl": [x for r in ok for x in r.itl_ms],
        "tpot": [t for r in ok if (t := r.tpot_ms) is not None],
        "e2e": [r.e2e_ms for r in ok],
    }


def summarize(records: Sequence[RequestRecord]) -> dict[str, float | int | None]:
    """The flat metrics dict SLO clauses are checked against (keys as in stack.config.slo.METRICS)."""
    ok = [r for r in records if r.ok]
    if records:
        start = min(r.start for r in records)
        duration = max(r.end for r in records) - start
    else:
        duration = 0.0
    out: dict[str, float | int | None] = {
        "requests": len(records),
        "ok": len(ok),
        "errors": len(records) - len(ok),
        "error_rate": (len(records) - len(ok)) / len(records) if records else math.nan,
        "duration_s": round(duration, 3),
        "requests_per_s": len(ok) / duration if duration > 0 else math.nan,
        "output_tokens_per_s": sum(r.output_tokens for r in ok) / duration if duration > 0 else math.nan,
        "prompt_tokens_mean": sum(r.prompt_tokens for r in ok) / len(ok) if ok else math.nan,
        "output_tokens_mean": sum(r.output_tokens for r in ok) / len(ok) if ok else math.nan,
    }
    for name, values in _latencies(records).items():
        out[f"mean_{name}_ms"] = sum(values) / len(values) if values else math.nan
        for p in PERCENTILES:
            out[f"p{p}_{name}_ms"] = percentile(values, p)
    return out


@dataclass
class Window:
    start_s: float  # from the first request
    requests: int
    errors: int
    output_tokens_per_s: float
    latency: dict[str, dict[int, float]]  # metric -> percentile -> ms


def over_time(records: Sequence[RequestRecord], window_s: float | None = None) -> list[Window]:
    """Requests grouped by the window they finished in: the percentiles over time that the plots show."""
    if not records:
        return []
    t0 = min(r.start for r in records)
    span = max(r.end for r in records) - t0
    width = window_s or max(1.0, span / 20)
    buckets: dict[int, list[RequestRecord]] = {}
    for r in records:
        buckets.setdefault(int((r.end - t0) // width), []).append(r)
    windows = []
    for index in range(int(span // width) + 1):
        group = buckets.get(index, [])
        lat = _latencies(group)
        windows.append(Window(
            start_s=index * width,
            requests=len(group),
            errors=sum(not r.ok for r in group),
            output_tokens_per_s=sum(r.output_tokens for r in group if r.ok) / width,
            latency={m: {p: percentile(lat[m], p) for p in (50, 95, 99)} for m in LATENCIES},
        ))
    return windows


def by_model(records: Iterable[RequestRecord]) -> dict[str, dict[str, float | int | None]]:
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        groups.setdefault(r.model, []).append(r)
    return {model: summarize(group) for model, group in sorted(groups.items())}


def errors_by_kind(records: Iterable[RequestRecord], limit: int = 5) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for r in records:
        if not r.ok:
            key = (f"HTTP {r.status}: " if r.status else "") + (r.error or "error")[:160]
            counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])[:limit]
