"""bench/gpu/tune_compare.py on the recorded H200 run of 2026-11-24 (ours and vLLM's auto_tune, same session):
the figures the README's side-by-side quotes are computed here from the committed result files."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.gpu.tune_compare import main, ours, theirs

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """The folder layout the device run leaves (/tmp/vstack-gpu-tune): tune-8b/ and auto-tune-8b/."""
    (tmp_path / "tune-8b").symlink_to(RESULTS / "2026-11-24-h200-tune-8b-1007")
    (tmp_path / "auto-tune-8b").symlink_to(RESULTS / "2026-11-24-h200-auto-tune-8b")
    return tmp_path


def test_auto_tune_time_counts_each_measurement_once(run: Path) -> None:
    t = theirs(run / "auto-tune-8b" / "result.txt")
    # Three calls, each ending with a "best ..." line that repeats a measurement's seconds: not counted again.
    lines = (run / "auto-tune-8b" / "result.txt").read_text().splitlines()
    measured = [line for line in lines if line.startswith(("max_num_seqs:", "gpu_memory_utilization:"))]
    assert len(t["rows"]) == 4 and len(measured) == 5
    assert t["seconds"] == sum(int(line.rsplit("seconds: ", 1)[1]) for line in measured)
    assert t["best"]["max_num_seqs"] == "256" and t["best"]["max_num_batched_tokens"] == "8192"


def test_side_by_side_on_served_requests_and_time(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    o = ours(run / "tune-8b" / "tune.json")
    served = {label: (rps, at) for label, rps, at in o["served"]}
    assert len(served) == 6 and all(rps and at for rps, at in served.values())
    # When each candidate's figure was in grows with the order they ran, up to the tune's whole time.
    times = [at for _label, _rps, at in o["served"]]
    assert times == sorted(times) and times[-1] <= o["spent_s"]
    assert main(run) == 0
    out = capsys.readouterr().out
    best = max(rps for rps, _at in served.values())
    theirs_best = float(theirs(run / "auto-tune-8b" / "result.txt")["best"]["throughput"])
    assert f"{best / theirs_best:.2f}x auto_tune's" in out
    assert "ours first served at least auto_tune's best with baseline" in out
