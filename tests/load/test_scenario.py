"""Scenario files: the shipped ones load, and every mistake names the file, the key and a fix."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from stack.errors import ConfigError
from stack.load.scenario import Distribution, find_scenario, load_scenario, load_scenario_file, scenarios_dir
from tests.load.conftest import write_scenario


@pytest.mark.parametrize("path", sorted(scenarios_dir().glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_scenario_loads(path: Path) -> None:
    scenario = load_scenario_file(path)
    assert scenario.name == path.stem
    assert scenario.num_prompts() >= 1


def _error(tmp_path: Path, text: str) -> ConfigError:
    path = write_scenario(tmp_path, text, "bad.yaml")
    with pytest.raises(ConfigError) as info:
        load_scenario_file(path)
    return info.value


def test_bad_value_names_file_key_and_fix(tmp_path: Path) -> None:
    exc = _error(tmp_path, "name: x\nload: {users: 0}\n")
    assert "bad.yaml: load.users:" in exc.message and "greater than or equal to 1" in exc.message
    assert "(got 0)" in exc.message
    assert exc.hint and "load.users" in exc.hint and "concurrent" in exc.hint


def test_unknown_key_suggests_the_near_one(tmp_path: Path) -> None:
    exc = _error(tmp_path, "name: x\nload: {usres: 4}\n")
    assert "bad.yaml: load.usres: unknown key; did you mean 'users'?" in exc.message
    assert exc.hint and "users" in exc.hint and "duration_s" in exc.hint


def test_bad_slo_clause_names_the_metric(tmp_path: Path) -> None:
    exc = _error(tmp_path, "name: x\nslo: ['p95_tfft_ms<800']\n")
    assert "bad.yaml: slo:" in exc.message and "did you mean 'p95_ttft_ms'" in exc.message
    assert exc.hint and "p95_ttft_ms<800" in exc.hint


def test_incomplete_distribution(tmp_path: Path) -> None:
    exc = _error(tmp_path, "name: x\nrequests: {prompt_tokens: {dist: normal, mean: 100}}\n")
    assert "bad.yaml: requests.prompt_tokens: dist 'normal' needs stddev" in exc.message
    assert exc.hint and "prompt_tokens: 256" in exc.hint


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    exc = _error(tmp_path, "name: x\nload: {users: 4\n")
    assert "bad.yaml:3" in exc.message and "invalid YAML" in exc.message


def test_rate_and_think_time_exclude_each_other(tmp_path: Path) -> None:
    exc = _error(tmp_path, "name: x\nload: {rate: 2, think_time_s: 1}\n")
    assert "bad.yaml: load: set either rate" in exc.message


def test_unknown_scenario_name_suggests() -> None:
    with pytest.raises(ConfigError, match="did you mean 'smoke'"):
        find_scenario("smok")


def test_cli_prints_file_key_and_fix(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "name: x\nload: {users: -3}\n", "broken.yaml")
    proc = subprocess.run([sys.executable, "-m", "stack.entrypoints.cli", "bench", "load", "--scenario", str(path),
                           "--url", "http://127.0.0.1:9"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 2, proc.stderr
    assert "broken.yaml: load.users:" in proc.stderr and "fix:" in proc.stderr


def test_distributions_stay_in_bounds_and_centre() -> None:
    rng = random.Random(7)
    normal = Distribution(dist="normal", mean=100, stddev=30, min=50, max=150)
    samples = [normal.sample(rng) for _ in range(2000)]
    assert min(samples) >= 50 and max(samples) <= 150
    assert 95 < sum(samples) / len(samples) < 105
    lognormal = Distribution(dist="lognormal", mean=200, stddev=150, min=1, max=100_000)
    mean = sum(lognormal.sample(rng) for _ in range(5000)) / 5000
    assert 180 < mean < 220
    assert Distribution.model_validate(64).sample(rng) == 64
    assert Distribution(dist="uniform", min=10, max=30).spread == pytest.approx(0.5)


def test_shipped_gpu_scenario_matches_the_reference_case() -> None:
    s = load_scenario("gpu-8b-1024-128")
    assert (s.requests.prompt_tokens.center, s.requests.output_tokens.center, s.load.users) == (1024, 128, 64)
