"""The GPU suite's assertions run on the lent GPU machine (bench/gpu/suite.sh) and skip elsewhere."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# bench/ (the suite these tests read) is not an installed package: import it from the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def nvidia_gpus() -> tuple[int, str]:
    """(count, why none) through NVML, the way `vstack` itself detects GPUs."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount()), ""
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # no driver, no library: the common case on CI
        return 0, f"{type(exc).__name__}: {exc}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    count, why = nvidia_gpus()
    if count:
        return
    skip = pytest.mark.skip(reason=f"no NVIDIA GPU here ({why or 'NVML reports 0 devices'}); "
                                   "the GPU suite runs on the lent machine: bash bench/gpu/suite.sh (README)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
