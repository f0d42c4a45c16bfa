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
