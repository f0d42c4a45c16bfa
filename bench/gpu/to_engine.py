"""The gateway's own share of the first token in one bench run, from its /metrics before and after (issue 54).

    python3 -m bench.gpu.to_engine BEFORE.prom AFTER.prom     -> {"requests": N, "p50_ms": ..., "mean_ms": ...}
    python3 -m bench.gpu.to_engine --fields BEFORE AFTER      -> to_engine_requests=N to_engine_p50_ms=...
    python3 -m bench.gpu.to_engine --engine BEFORE AFTER      -> engine_ttft_requests=N ... engine_ttft_mean_ms=...

vstack_gateway_time_to_engine_call_seconds (a request's arrival at the gateway to its call to the engine) is a
histogram, summed over its models and deployments here; the run's share is AFTER minus BEFORE, bucket by bucket.
A quantile is reported as the upper bound of the bucket it falls in (Prometheus' histogram_quantile would
interpolate inside it; a bound says no more than the buckets know). bench/gpu/serve_bench.sh runs this after each
run through a gateway: at a burst it shows how much of the gateway's added first-token time passes before the
engine is even called.

`--engine` reads the engine's own scrape instead: vLLM's vllm:time_to_first_token_seconds (its arrival at the
engine's API server to its first token), so a run through a gateway and a direct one say whether the engine itself
answered later (the requests reached it spread or bunched differently) or the time passed outside it. The mean
(the histogram's sum over its count) is exact where a bucket bound is not: vLLM's buckets near 0.5 s are 0.25 s wide.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

NAME = "vstack_gateway_time_to_engine_call_seconds"
ENGINE_TTFT = "vllm:time_to_first_token_seconds"


def buckets(text: str, name: str = NAME) -> tuple[dict[float, float], float]:
    """Cumulative counts by upper bound (le) and the sum of the observations, summed over every label set."""
    out: dict[float, float] = defaultdict(float)
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"{name}_bucket":
                out[float(s.labels["le"])] += s.value
            elif s.name == f"{name}_sum":
                total += s.value
    return dict(out), total


def run_share(before: str, after: str, name: str = NAME) -> dict[str, float | int | None]:
    (b, b_sum), (a, a_sum) = buckets(before, name), buckets(after, name)
    delta = sorted((le, a[le] - b.get(le, 0.0)) for le in a)
    total = delta[-1][1] if delta else 0.0

    def bound(q: float) -> float | None:
        if not total:
            return None
        le = next(le for le, n in delta if n >= q * total)
        return None if math.isinf(le) else round(le * 1000, 2)

    mean = round((a_sum - b_sum) / total * 1000, 2) if total else None
    return {"requests": int(total), "p50_ms": bound(0.5), "p99_ms": bound(0.99), "mean_ms": mean}


def main(argv: list[str]) -> int:
    mode = argv[0] if argv[:1] in (["--fields"], ["--engine"]) else None
    files = argv[1:] if mode else argv
    if len(files) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    name, prefix = (ENGINE_TTFT, "engine_ttft_") if mode == "--engine" else (NAME, "to_engine_")
    share = run_share(Path(files[0]).read_text(), Path(files[1]).read_text(), name)
    print(" ".join(f"{prefix}{k}={v}" for k, v in share.items()) if mode else json.dumps(share))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
