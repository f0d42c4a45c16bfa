"""The gateway's own share of the first token in one bench run, from its /metrics before and after (issue 54).

    python3 -m bench.gpu.to_engine BEFORE.prom AFTER.prom     -> {"requests": N, "p50_ms": ..., "p99_ms": ...}
    python3 -m bench.gpu.to_engine --fields BEFORE AFTER      -> to_engine_requests=N to_engine_p50_ms=...

vstack_gateway_time_to_engine_call_seconds (a request's arrival at the gateway to its call to the engine) is a
histogram, summed over its models and deployments here; the run's share is AFTER minus BEFORE, bucket by bucket.
A quantile is reported as the upper bound of the bucket it falls in (Prometheus' histogram_quantile would
interpolate inside it; a bound says no more than the buckets know). bench/gpu/serve_bench.sh runs this after each
run through a gateway: at a burst it shows how much of the gateway's added first-token time passes before the
engine is even called.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

NAME = "vstack_gateway_time_to_engine_call_seconds"


def buckets(text: str) -> dict[float, float]:
    """Cumulative counts by upper bound (le), summed over every label set."""
    out: dict[float, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"{NAME}_bucket":
                out[float(s.labels["le"])] += s.value
    return dict(out)


def run_share(before: str, after: str) -> dict[str, float | int | None]:
    b, a = buckets(before), buckets(after)
    delta = sorted((le, a[le] - b.get(le, 0.0)) for le in a)
    total = delta[-1][1] if delta else 0.0

    def bound(q: float) -> float | None:
        if not total:
            return None
        le = next(le for le, n in delta if n >= q * total)
        return None if math.isinf(le) else round(le * 1000, 2)

    return {"requests": int(total), "p50_ms": bound(0.5), "p99_ms": bound(0.99)}


def main(argv: list[str]) -> int:
    fields = argv[:1] == ["--fields"]
    files = argv[1:] if fields else argv
    if len(files) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    share = run_share(Path(files[0]).read_text(), Path(files[1]).read_text())
    print(" ".join(f"to_engine_{k}={v}" for k, v in share.items()) if fields else json.dumps(share))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
