"""Prometheus text summed per metric: what the console's Live page and the spill's engine load
(stack.gateway.routing.engine_load) read from each engine's own `vllm:*` series, parsed one way."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Scrape:
    t: float
    counters: dict[str, float] = field(default_factory=dict)  # summed over labels; histograms' _sum, _count too
    gauges: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)  # histogram -> le -> cumulative count


def parse(text: str, label: tuple[str, str] | None = None) -> Scrape:
    """Sum every series of each metric; with `label` (name, value) only the series carrying it."""
    s = Scrape(time.monotonic())
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if label is not None and sample.labels.get(label[0]) != label[1]:
                continue
            name, value = sample.name, sample.value
            if (fam.type == "counter" and name.endswith("_total")) or (
                    fam.type == "histogram" and name.endswith(("_sum", "_count"))):  # monotonic, as counters
                s.counters[name] = s.counters.get(name, 0.0) + value
            elif fam.type == "gauge":
                s.gauges[name] = s.gauges.get(name, 0.0) + value
            elif fam.type == "histogram" and name.endswith("_bucket"):
                le = float(sample.labels["le"])
                hist = s.buckets.setdefault(name.removesuffix("_bucket"), {})
                hist[le] = hist.get(le, 0.0) + value
    return s
