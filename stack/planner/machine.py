"""The machine the plan is for, as numbers: from a hardware profile, or from what was detected."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from stack.config.schema import HardwareProfile
from stack.planner.memory import GIB


def _label(hw: HardwareProfile) -> str:
    """"NVIDIA H100 80 GB (SXM or PCIe, HBM3)" -> "NVIDIA H100"."""
    text = (hw.description or hw.name).split(",")[0]
    return re.sub(r"\s+\d+\s*GB.*$", "", text).strip() or hw.name


@dataclass(frozen=True)
class Machine:
    accelerator: str
    label: str
    gpu_count: int
    memory_per_gpu: int  # bytes, the total CUDA reports
    free_per_gpu: int  # bytes free before vLLM starts
    ram_total: int = 0
    ram_available: int = 0
    detected: bool = False
    nominal_gib: float = 0  # the size on the box (24 GB card), for messages


    @classmethod
    def from_profile(cls, hw: HardwareProfile, gpus: int | None = None) -> Machine:
        """What a profile says a machine of this kind has (no detection: `vstack plan --gpu ...`)."""
        label = _label(hw)
        if hw.accelerator == "cpu":
            import psutil  # the host's RAM is the CPU profile's only size

            vm = psutil.virtual_memory()
            return cls("cpu", label, 0, 0, 0, vm.total, vm.available)
        usable = hw.planner.usable_memory_gib or (hw.memory_gib or 0) * 0.985
        memory = int(usable * GIB)
        free = memory - int(hw.planner.reserved_gib * GIB)
        return cls("gpu", label, gpus or hw.gpu_count, memory, free, nominal_gib=hw.memory_gib or usable)

    @classmethod
    def from_detected(cls, hw: HardwareProfile, info: Any) -> Machine:
        """From stack.hardware.HardwareInfo (duck-typed: gpus[].memory_total/memory_free, ram_*)."""
        gpus = list(getattr(info, "gpus", []) or [])
        if hw.accelerator == "cpu" or not gpus:
            return cls("cpu", _label(hw), 0, 0, 0,
                       int(info.ram_total), int(info.ram_available), detected=True)
        total = min(g.memory_total for g in gpus)
        if hw.planner.usable_memory_gib:
            # NVML counts memory CUDA never hands out (H200: 140.4 GiB vs 139.8 GiB); vLLM sizes from CUDA's.
            total = min(total, int(hw.planner.usable_memory_gib * GIB))
        return cls("gpu", gpus[0].name, len(gpus), total,
                   min(g.memory_free for g in gpus), int(getattr(info, "ram_total", 0)),
                   int(getattr(info, "ram_available", 0)), detected=True, nominal_gib=hw.memory_gib or 0)

    def describe(self, count: int | None = None) -> str:
        n = count if count is not None else self.gpu_count
        if self.accelerator == "cpu":
            return f"this machine ({self.ram_available / GIB:.1f} GiB of RAM free)"
        size = f"{self.nominal_gib or self.memory_per_gpu / GIB:.0f} GiB"
        name = self.label.replace("NVIDIA ", "").replace("GeForce ", "")
        # Read aloud, acronyms starting with these letters take "an" (an H100, an RTX 4090, an L4).
        article = "an" if name[:1].upper() in "AEFHILMNORSX" else "a"
        return f"{article} {name} has {size}" if n == 1 else f"{n} x {name} have {n} x {size}"
