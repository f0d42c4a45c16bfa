"""bench/gpu/to_engine.py on Prometheus text written by prometheus_client itself, with the gateway's own
histogram (stack.gateway.metrics): one run's share between two scrapes, its quantiles as bucket bounds."""

from __future__ import annotations

from prometheus_client import generate_latest

from bench.gpu.to_engine import main, run_share
from stack.gateway.metrics import GatewayMetrics


def test_a_runs_share_is_the_difference_of_two_scrapes_and_its_quantiles_are_bucket_bounds(tmp_path, capsys) -> None:
    metrics = GatewayMetrics()
    for seconds in (0.0004, 0.0004, 0.003):  # before the run: a warm-up
        metrics.to_engine.labels("m", "engine-a").observe(seconds)
    before = generate_latest(metrics.registry).decode()
    for i in range(100):  # the run: 98 quick, 2 behind a burst, on two deployments
        metrics.to_engine.labels("m", "engine-a" if i % 2 else "engine-b").observe(0.0008 if i < 98 else 0.15)
    after = generate_latest(metrics.registry).decode()
    assert run_share(before, after) == {"requests": 100, "p50_ms": 1.0, "p99_ms": 200.0}
    assert run_share(after, after) == {"requests": 0, "p50_ms": None, "p99_ms": None}
    (tmp_path / "a").write_text(before)
    (tmp_path / "b").write_text(after)
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert capsys.readouterr().out.strip() == '{"requests": 100, "p50_ms": 1.0, "p99_ms": 200.0}'
    assert main([]) == 2


def test_the_log_fields_are_what_serve_rows_reads_back(tmp_path, capsys) -> None:
    from bench.gpu.serve_rows import MORE

    metrics = GatewayMetrics()
    (tmp_path / "a").write_text(generate_latest(metrics.registry).decode())
    metrics.to_engine.labels("m", "engine-a").observe(0.004)
    (tmp_path / "b").write_text(generate_latest(metrics.registry).decode())
    assert main(["--fields", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    line = capsys.readouterr().out.strip()
    assert line == "to_engine_requests=1 to_engine_p50_ms=5.0 to_engine_p99_ms=5.0"
    assert dict(MORE.findall(line)) == {"to_engine_p50_ms": "5.0", "to_engine_p99_ms": "5.0"}
