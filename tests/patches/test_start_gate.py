"""The start gate (stack/patches/runtime/start_gate.py): what holds a pre-started tune engine before its device.

Against the installed vLLM's WorkerWrapperBase; the whole path (a real engine held, then let go after the
other candidate's engine stopped) is in tests/load/test_tune_e2e.py.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from stack.engine.start_gate import GATE_ENV, TIMEOUT_ENV, waiting_marker
from stack.load.prestart import gate_available
from stack.patches.runtime import start_gate


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


def test_the_tune_overlaps_starts_only_where_the_gate_patch_runs() -> None:
    assert gate_available({})
    assert not gate_available({"VSTACK_RUNTIME_PATCHES": "0"})
    assert not gate_available({"VSTACK_DISABLE_PATCHES": "cpu-aot-cache-reuse, engine-start-gate"})
    assert gate_available({"VSTACK_DISABLE_PATCHES": "cpu-aot-cache-reuse"})
