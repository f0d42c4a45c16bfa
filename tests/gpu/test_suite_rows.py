"""Every row the GPU suite ran on this machine passes: profiles served end to end, the planner within 3% of
vLLM's KV cache on every layout, sleep switching through the manager. Reads VSTACK_GPU_RESULTS (set by
bench/gpu/suite.sh); skipped where there is no NVIDIA GPU."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bench.gpu.suite import KV_TOLERANCE, verdict

pytestmark = pytest.mark.gpu


def suite_results() -> dict[str, Any] | None:
    path = os.environ.get("VSTACK_GPU_RESULTS")
    return json.loads(Path(path).read_text()) if path and Path(path).is_file() else None


# Read at collection: the test session's autouse fixtures clear VSTACK_* variables before each test.
RESULTS = suite_results()
ROWS = [r for r in RESULTS["rows"] if r.get("device") == RESULTS.get("label")] if RESULTS else []


def test_suite_ran() -> None:
    assert RESULTS is not None, "VSTACK_GPU_RESULTS names no results file: run bash bench/gpu/suite.sh"
    assert ROWS, "the results file has no row for this device"


@pytest.mark.parametrize("row", [r for r in ROWS if r["kind"] == "profile"], ids=lambda r: r["row"])
def test_profile_served_end_to_end(row: dict[str, Any]) -> None:
    assert "error" not in row, row.get("error")
    assert row["started_s"] > 0 and row["up_exit"] == 0
    assert row["chat_ok"], row.get("chat")
    assert row["json_ok"], row.get("json_answer")
    assert row["tools_ok"], row.get("tools")  # named/required parse, auto accepted: the profile's tool parser
    assert row["metrics_ok"], row.get("metrics")
    assert abs(row["kv_error"]) <= KV_TOLERANCE, (row["planner"], row["vllm"])
    assert row["stopped_clean"], row.get("memory_after")


@pytest.mark.parametrize("row", [r for r in ROWS if r["kind"] == "layout"], ids=lambda r: r["row"])
def test_planner_matches_vllm_kv_cache(row: dict[str, Any]) -> None:
    assert "error" not in row, row.get("error")
    assert abs(row["kv_error"]) <= KV_TOLERANCE, (row["planner"], row["vllm"])


@pytest.mark.parametrize("row", [r for r in ROWS if r["kind"] in ("switch", "tools")], ids=lambda r: r["row"])
def test_switching_and_tools(row: dict[str, Any]) -> None:
    assert verdict(row) in ("ok", "pending"), verdict(row)
