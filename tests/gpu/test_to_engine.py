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
    assert run_share(before, after) == {"requests": 100, "p50_ms": 1.0, "p99_ms": 200.0, "mean_ms": 3.78}
    assert run_share(after, after) == {"requests": 0, "p50_ms": None, "p99_ms": None, "mean_ms": None}
    (tmp_path / "a").write_text(before)
    (tmp_path / "b").write_text(after)
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert capsys.readouterr().out.strip() == '{"requests": 100, "p50_ms": 1.0, "p99_ms": 200.0, "mean_ms": 3.78}'
    assert main([]) == 2


def test_the_log_fields_are_what_serve_rows_reads_back(tmp_path, capsys) -> None:
    from bench.gpu.serve_rows import MORE

    metrics = GatewayMetrics()
    (tmp_path / "a").write_text(generate_latest(metrics.registry).decode())
    metrics.to_engine.labels("m", "engine-a").observe(0.004)
    (tmp_path / "b").write_text(generate_latest(metrics.registry).decode())
    assert main(["--fields", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    line = capsys.readouterr().out.strip()
    assert line == "to_engine_requests=1 to_engine_p50_ms=5.0 to_engine_p99_ms=5.0 to_engine_mean_ms=4.0"
    assert dict(MORE.findall(line)) == {
        "to_engine_p50_ms": "5.0",
        "to_engine_p99_ms": "5.0",
        "to_engine_mean_ms": "4.0",
    }


def test_the_engines_own_first_token_is_read_from_vllms_histogram(tmp_path, capsys) -> None:
    """--engine: vLLM's vllm:time_to_first_token_seconds (written here with vLLM's name, labels and buckets by
    prometheus_client, as vLLM's own server does), the run's share and its exact mean."""
    from prometheus_client import CollectorRegistry, Histogram

    from bench.gpu.serve_rows import MORE

    registry = CollectorRegistry()
    ttft = Histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        ["model_name", "engine"],
        buckets=[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0],
        registry=registry,
    )
    ttft.labels("llama8b", "0").observe(2.0)  # the warm-up
    (tmp_path / "a").write_text(generate_latest(registry).decode())
    for seconds in (0.30, 0.40, 0.45, 0.60):
        ttft.labels("llama8b", "0").observe(seconds)
    (tmp_path / "b").write_text(generate_latest(registry).decode())
    assert main(["--engine", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    line = capsys.readouterr().out.strip()
    assert line == "engine_ttft_requests=4 engine_ttft_p50_ms=500.0 engine_ttft_p99_ms=750.0 engine_ttft_mean_ms=437.5"
    assert dict(MORE.findall(line))["engine_ttft_mean_ms"] == "437.5"
