"""`vstack tune`'s refusals before any engine starts: each names the problem and the fix (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.load.conftest import Vstack, write_scenario

pytest.importorskip("vllm", reason="needs vLLM (./install.sh --dev)")


def test_goodput_needs_a_latency_limit_and_vllm_bench(vstack: Vstack, tmp_path: Path) -> None:
    scenario = str(write_scenario(tmp_path))
    out = tmp_path / "tune"
    no_limit = vstack("tune", "--scenario", scenario, "--slo", "error_rate<0.5", "--out", str(out), timeout=200)
    assert no_limit.returncode == 2, no_limit.stdout + no_limit.stderr
    assert "goodput mode needs a latency limit" in no_limit.stderr and "p95_ttft_ms<800" in no_limit.stderr
    locust = vstack("tune", "--scenario", scenario, "--method", "locust", "--out", str(out), timeout=200)
    assert locust.returncode == 2 and "--mode capacity" in locust.stderr
    assert not out.exists()  # nothing measured, nothing written


def test_vllms_parser_refuses_before_any_engine_starts(vstack: Vstack, tmp_path: Path) -> None:
    """vLLM's own parser sees the profile and every candidate in one child, before the first start: a refused
    candidate is a result that names vLLM's reason, a refused profile an error with the fix."""
    scenario = str(write_scenario(tmp_path))
    out = tmp_path / "tune"
    common = ["tune", "--scenario", scenario, "--slo", "p95_ttft_ms<60000", "--out", str(out)]
    # Our renderer passes a JSON option's string on; vLLM's parser cannot read it as JSON.
    refused = vstack(*common, "--set", "speculative_config=notjson", "--time-budget", "30", timeout=300)
    text = " ".join(refused.stdout.split())
    assert refused.returncode == 0, refused.stdout + refused.stderr  # the baseline is still to measure
    assert "rejects the rendered command" in text and "--speculative-config" in text
    assert "paused by --time-budget: 1 of 2 candidates left" in text  # the baseline, not the refused one
    assert not (out / "logs").exists() or not list((out / "logs").glob("*.engine.log"))  # nothing started

    vstack.env["VSTACK_ENGINE__SPECULATIVE_CONFIG"] = "notjson"
    broken = vstack(*common, "--restart", "--time-budget", "30", timeout=300)
    assert broken.returncode == 2, broken.stdout + broken.stderr
    assert "rejects the rendered command" in broken.stderr and "vstack config render" in broken.stderr


def test_quality_floor_out_of_range_is_refused_by_name(vstack: Vstack, tmp_path: Path) -> None:
    scenario = str(write_scenario(tmp_path))
    out = tmp_path / "tune"
    bad = vstack("tune", "--scenario", scenario, "--min-match", "1.5", "--out", str(out), timeout=120)
    assert bad.returncode == 2 and "--min-match" in bad.stderr and "less than or equal to 1" in bad.stderr, bad.stderr
    assert not out.exists()
