"""What this machine has: NVIDIA GPUs through NVML (nvidia-ml-py), else the CPU and its free memory."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import psutil

from stack.config.schema import HardwareProfile, StackConfig
from stack.counts import count

GIB = 1024**3


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_total: int
    memory_free: int
    compute_capability: str | None = None


@dataclass(frozen=True)
class HardwareInfo:
    gpus: list[GpuInfo] = field(default_factory=list)
    cpu_count: int = 1
    ram_total: int = 0
    ram_available: int = 0
    driver: str | None = None
    nvml_error: str | None = None

    @property
    def accelerator(self) -> str:
        return "gpu" if self.gpus else "cpu"


def _nvml_gpus(kept: frozenset[int] = frozenset()) -> tuple[list[GpuInfo], str | None, str | None]:
    try:
        import pynvml
    except ImportError:
        return [], None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # no driver, no GPU: the normal case on a CPU machine
        return [], None, str(exc)
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                cc = f"{major}.{minor}"
            except pynvml.NVMLError:
                cc = None
            free = mem.free + _held_by(pynvml, handle, kept)
            gpus.append(GpuInfo(i, name.decode() if isinstance(name, bytes) else name, mem.total, free, cc))
        return gpus, driver.decode() if isinstance(driver, bytes) else driver, None
    finally:
        pynvml.nvmlShutdown()


def _held_by(pynvml: object, handle: object, pids: frozenset[int]) -> int:
    """GPU bytes the processes `pids` hold on this device (0 where NVML cannot tell)."""
    if not pids:
        return 0
    try:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)  # type: ignore[attr-defined]
    except Exception:  # NVML errors differ by version: then nothing is added back
        return 0
    return sum(int(p.usedGpuMemory or 0) for p in procs if p.pid in pids)


def _ram_held_by(pids: frozenset[int]) -> int:
    held = 0
    for pid in pids:
        try:
            held += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return held


def detect(kept: frozenset[int] = frozenset()) -> HardwareInfo:
    """Set VSTACK_FORCE_CPU=1 to ignore GPUs (CPU engine on a GPU machine). `kept`: the processes of engines
    to be re-attached: the memory they hold counts as free, as it would be for the engine planned in their
    place (stack.engine.kept)."""
    count("detect")
    if os.environ.get("VSTACK_FORCE_CPU") == "1":
        gpus, driver, error = [], None, "VSTACK_FORCE_CPU=1"
    else:
        gpus, driver, error = _nvml_gpus(kept)
    vm = psutil.virtual_memory()
    available = min(vm.total, vm.available + _ram_held_by(kept))
    return HardwareInfo(gpus, os.cpu_count() or 1, vm.total, available, driver, error)


def match_profile(info: HardwareInfo, cfg: StackConfig) -> tuple[HardwareProfile, str]:
    """The hardware profile for what was detected, and why it was chosen."""
    if not info.gpus:
        return cfg.hardware["cpu"], "no NVIDIA GPU found" + (f" ({info.nvml_error})" if info.nvml_error else "")
    gpu = info.gpus[0]
    count = len(info.gpus)
    candidates = [
        hw for hw in cfg.hardware.values()
        if hw.accelerator == "gpu" and any(pattern.lower() in gpu.name.lower() for pattern in hw.match)
    ]
    # Prefer the profile written for this many GPUs (e.g. a100-80gb-x8 on an 8-GPU node), else the 1-GPU one.
    exact = [hw for hw in candidates if hw.gpu_count == count]
    single = [hw for hw in candidates if hw.gpu_count == 1]
    chosen = (exact or single or candidates or [None])[0]
    if chosen is None:
        # An unknown GPU: the closest profile by memory that is not larger than what the card has.
        mem_gib = gpu.memory_total / GIB
        fitting = [hw for hw in cfg.hardware.values() if hw.accelerator == "gpu" and hw.gpu_count == 1
                   and (hw.memory_gib or 0) <= mem_gib + 0.5]
        if not fitting:
            return cfg.hardware["cpu"], f"{gpu.name} matches no hardware profile and is smaller than all of them"
        chosen = max(fitting, key=lambda hw: hw.memory_gib or 0)
        return chosen, f"{gpu.name} matches no profile; using {chosen.name}, the largest that fits in {mem_gib:.0f} GiB"
    return chosen, f"{count} x {gpu.name} matches {chosen.name}"

