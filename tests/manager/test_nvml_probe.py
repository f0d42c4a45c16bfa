"""NvmlProbe initialises NVML once and re-initialises after a failed reading. NVML is the GPU driver's library,
absent from this machine (pynvml's nvmlInit fails here): a stand-in module counts the calls. The real path runs
in every GPU switch bench (bench/gpu/switch_time.sh)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from stack.manager.memory import NvmlProbe


class NVMLError(Exception):
    pass


def fake_nvml(used: list[int]) -> types.SimpleNamespace:
    calls = {"init": 0, "fail": False}

    def memory(handle: int):
        if calls["fail"]:
            raise NVMLError("GPU is lost")
        return types.SimpleNamespace(used=used[handle])

    def init() -> None:
        calls["init"] += 1

    return types.SimpleNamespace(NVMLError=NVMLError, nvmlInit=init, nvmlDeviceGetCount=lambda: len(used),
                                 nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetMemoryInfo=memory,
                                 calls=calls)  # fmt: skip


def test_nvml_is_initialised_once_and_again_after_a_failed_reading(monkeypatch) -> None:
    nvml = fake_nvml([3, 4])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    probe = NvmlProbe()
    assert [probe.used() for _ in range(3)] == [7, 7, 7] and nvml.calls["init"] == 1
    nvml.calls["fail"] = True
    assert probe.used() is None
    nvml.calls["fail"] = False
    assert probe.used() == 7 and nvml.calls["init"] == 2


def test_no_driver_reads_none() -> None:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("an NVIDIA driver is here: NVML reads the real GPUs")
    assert NvmlProbe().used() is None  # pynvml installed, no NVIDIA driver
