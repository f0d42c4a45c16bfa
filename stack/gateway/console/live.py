"""The Live page's figures, from Prometheus text: each engine's own `vllm:*` series and the gateway's.

Counters become rates and histograms become p50/p95 over the last `window_s` seconds from the difference of
two scrapes; gauges are shown as they are. Names: docs/design/vllm-notes.md (stable 0.26 -> 0.33).
"""

from __future__ import annotations

import math
from collections import deque

from stack.gateway.prom_text import Scrape


def quantile(buckets: dict[float, float], q: float) -> float | None:
    """Prometheus' histogram_quantile over cumulative buckets (linear inside a bucket)."""
    if not buckets:
        return None
    edges = sorted(buckets)
    total = buckets[edges[-1]]
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for le in edges:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            inside = count - below
            return lower + (le - lower) * ((rank - below) / inside if inside else 0)
        lower, below = le, count
    return lower


def delta(new: dict[float, float], old: dict[float, float] | None) -> dict[float, float]:
    old = old or {}
    return {le: max(0.0, v - old.get(le, 0.0)) for le, v in new.items()}


class Series:
    """Scrapes of one source over the last `window_s` seconds."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self.scrapes: deque[Scrape] = deque()

    def add(self, s: Scrape) -> None:
        self.scrapes.append(s)
        while len(self.scrapes) > 2 and s.t - self.scrapes[0].t > self.window_s:
            self.scrapes.popleft()

    def rate(self, name: str, last_only: bool = True) -> float | None:
        if len(self.scrapes) < 2:
            return None
        a, b = (self.scrapes[-2] if last_only else self.scrapes[0]), self.scrapes[-1]
        if name not in b.counters or b.t <= a.t:
            return None
        return max(0.0, b.counters[name] - a.counters.get(name, 0.0)) / (b.t - a.t)

    def ratio(self, num: str, den: str) -> float | None:
        if len(self.scrapes) < 2:
            return None
        a, b = self.scrapes[0], self.scrapes[-1]
        d = b.counters.get(den, 0.0) - a.counters.get(den, 0.0)
        return None if d <= 0 else (b.counters.get(num, 0.0) - a.counters.get(num, 0.0)) / d

    def pct(self, name: str, q: float) -> float | None:
        if not self.scrapes or name not in self.scrapes[-1].buckets:
            return None
        first = self.scrapes[0].buckets.get(name) if len(self.scrapes) > 1 else None
        value = quantile(delta(self.scrapes[-1].buckets[name], first), q)
        return None if value is None else round(value * 1000, 1)

    def gauge(self, name: str) -> float | None:
        return self.scrapes[-1].gauges.get(name) if self.scrapes else None


def engine_row(series: Series) -> dict:
    kv = series.gauge("vllm:kv_cache_usage_perc")
    hit = series.ratio("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
    rnd = lambda v, n=1: None if v is None else round(v, n)  # noqa: E731
    return {
        "tokens_s": rnd(series.rate("vllm:generation_tokens_total")),
        "prompt_tokens_s": rnd(series.rate("vllm:prompt_tokens_total")),
        "ttft_p50_ms": series.pct("vllm:time_to_first_token_seconds", 0.5),
        "ttft_p95_ms": series.pct("vllm:time_to_first_token_seconds", 0.95),
        "waiting": series.gauge("vllm:num_requests_waiting"),
        "running": series.gauge("vllm:num_requests_running"),
        "kv_use_pct": rnd(None if kv is None else kv * 100),
        "prefix_hit_pct": rnd(None if hit is None else hit * 100),
    }


def gateway_row(series: Series) -> dict:
    rate = series.rate("vstack_gateway_requests_total")
    return {
        "requests_s": None if rate is None else round(rate, 2),
        "in_flight": series.gauge("vstack_gateway_requests_in_flight"),
        "ttft_p50_ms": series.pct("vstack_gateway_time_to_first_token_seconds", 0.5),
        "ttft_p95_ms": series.pct("vstack_gateway_time_to_first_token_seconds", 0.95),
    }
