"""How much memory each engine needs (from the fit planner) and how much the engines may use together.

On a GPU an engine takes `gpu_memory_utilization` x the device whatever the model (vLLM sizes its KV
cache to fill it), so its need is the planner's `requested`; on the CPU build it is weights + the KV
space it was given + the engine's own overhead. NVML tells whether a sleep really freed the device.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol

import psutil

from stack.config.sections.manager import ManagerConfig
from stack.engine_env import visible_gpus
from stack.planner.decisions import Fit

log = logging.getLogger("stack.manager")
GIB = 1024**3


class MemoryProbe(Protocol):
    def used(self) -> int | None: ...


class NvmlProbe:
    """Bytes used on the GPUs the engines share (all visible devices, summed). NVML is initialised once, at
    the first reading, and kept: nvmlInit enumerates the devices (tens of ms), and a switch reads the memory
    two or three times (the order, before and after a sleep). A failed reading drops the handles, so the next
    one initialises again (a driver reloaded under us)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: list[object] | None = None

    def _devices(self, nvml: Any) -> list[object]:
        with self._lock:
            if self._handles is None:
                nvml.nvmlInit()
                self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            return self._handles

    def used(self) -> int | None:
        try:
            import pynvml
        except ImportError:
            return None
        try:
            return sum(pynvml.nvmlDeviceGetMemoryInfo(h).used for h in self._devices(pynvml))
        except pynvml.NVMLError:
            with self._lock:
                self._handles = None
            return None


class NoProbe:
    def used(self) -> int | None:
        return None


def capacity_bytes(settings: ManagerConfig, hardware: object) -> int:
    """What the engines may hold together, per GPU: the configured budget, else one GPU's memory (the smallest),
    else free RAM x headroom.

    Per GPU, because that is the unit of an engine's need (the planner's `requested`: vLLM's
    gpu_memory_utilization x one GPU) and because every engine this gateway starts counts its GPUs from the first
    (vLLM's default: a tensor-parallel 2 engine takes GPUs 0 and 1, a single-GPU one GPU 0), so the first GPU holds
    every engine's need. The sum over GPUs let a second 0.7-of-a-GPU engine start beside an awake one on a
    2-GPU host, where vLLM refused it ("Free memory on device cuda:0 ... less than desired"): the lent x2's
    switch bench, 2026-11-29."""
    if settings.memory_budget_gib:
        return int(settings.memory_budget_gib * GIB)
    gpus = list(getattr(hardware, "gpus", []) or [])
    if gpus:
        return min(g.memory_total for g in gpus)
    available = getattr(hardware, "ram_available", 0) or psutil.virtual_memory().available
    return int(available * settings.memory_headroom)


def pinned_gpus(env: Mapping[str, str], count: int) -> frozenset[int] | None:
    """The GPUs an engine's environment pins it to (CUDA_VISIBLE_DEVICES as indices, the first `count` of them: its
    tensor x pipeline x data parallel GPUs), so that models pinned to different GPUs of one host are budgeted apart
    and resident together. None (it counts from GPU 0, as every unpinned engine does) without the variable, or
    with a value that is not a list of indices (UUIDs, MIG names): such an engine is taken to share every GPU."""
    used = visible_gpus(env, count)
    return None if used is None else frozenset(used)


def engine_need(fit: Fit | None) -> tuple[int | None, str]:
    """(bytes, how we know) for a planned engine, from the fit planner's result kept with its plan
    (stack.planner.plans.ModelPlan.fit); None when the planner could not tell (the manager then treats
    the model as needing the whole machine: never co-resident)."""
    if fit is None:
        return None, "unknown (not planned)"
    return fit.budget.requested, f"planner: {fit.budget.device} {fit.budget.requested / GIB:.1f} GiB"


def engine_weights(fit: Fit | None) -> tuple[int | None, int | None]:
    """(bytes per GPU, bytes of all ranks) of an engine's weights, from the fit planner; None: unknown."""
    if fit is None:
        return None, None
    return fit.budget.weights, fit.weights.total_bytes


def host_budget_bytes(settings: ManagerConfig, hardware: object, engines: int) -> int | None:
    """Host RAM the level-1 sleepers' weights may take together (stack.manager.tiers.host_budget)."""
    from stack.manager.tiers import host_budget

    return host_budget(int(getattr(hardware, "ram_total", 0) or 0), int(getattr(hardware, "ram_available", 0) or 0),
                       engines, fraction=settings.host_memory_fraction,
                       per_engine_bytes=int(settings.host_per_engine_gib * GIB),
                       configured_gib=settings.host_memory_budget_gib)  # fmt: skip
