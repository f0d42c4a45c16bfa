"""The trace replay's summary says why each failed request failed (a GPU run of the switch schedulers counted two
failures and nothing said why: bench/results/2026-11-27-h200-switch-scheduler)."""

from bench.harness.trace_replay import Served, summary


def test_failures_are_counted_by_reason() -> None:
    served = [Served("a", 0.0, 0.5, 1.0), Served("a", 0.1, None, error="HTTP 503"),
              Served("b", 0.2, None, error="HTTP 503"), Served("b", 0.3, None), Served("b", 0.4, 9.0, 12.0)]
    out = summary(served, slo_ttft_s=8, duration_s=1.0)
    assert out["failed"] == 3 and out["within_slo"] == 1
    assert out["failures"] == {"HTTP 503": 2, "no token in the stream": 1}
