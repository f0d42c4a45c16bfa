"""The GPUs the suite runs on, read through NVML (what `vstack down` must give back) and CUDA (the total vLLM
sizes its budget from, read in a child process so that this one holds no CUDA context)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass

GIB = 1024**3
# What may stay on a GPU after `vstack down`: NVML's own reservation moves by a few MiB; an engine left
# behind holds gigabytes.
RELEASE_SLACK = 512 * 1024**2


@dataclass
class Device:
    name: str
    count: int
    cuda_total: int  # bytes per GPU, as torch.cuda.mem_get_info reports it (vLLM's total)
    nvml_total: int
    driver: str = ""

    @property
    def hopper(self) -> bool:
        return any(chip in self.name for chip in ("H100", "H200", "H800", "H20", "GH200"))

    @property
    def label(self) -> str:
        """h200, h200-x2, h100, cpu: the name in results files."""
        short = "cpu" if self.count == 0 else self.name.replace("NVIDIA ", "").split()[0].lower()
        return short + (f"-x{self.count}" if self.count > 1 else "")

    def used_bytes(self) -> list[int]:
        """NVML's used memory per GPU."""
        if not self.count:
            return []
        import pynvml

        pynvml.nvmlInit()
        try:
            return [int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used)
                    for i in range(self.count)]
        finally:
            pynvml.nvmlShutdown()

    def processes(self) -> list[int]:
        if not self.count:
            return []
        import pynvml

        pynvml.nvmlInit()
        try:
            pids = []
            for i in range(self.count):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                pids += [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
            return pids
        finally:
            pynvml.nvmlShutdown()

    def wait_released(self, baseline: list[int], timeout: float = 60) -> tuple[bool, dict]:
        """True once every GPU is back to its baseline (within RELEASE_SLACK) with no compute process."""
        deadline = time.monotonic() + timeout
        while True:
            used, procs = self.used_bytes(), self.processes()
            clean = not procs and all(u <= b + RELEASE_SLACK for u, b in zip(used, baseline, strict=True))
            if clean or time.monotonic() > deadline:
                return clean, {"used_gib": [round(u / GIB, 2) for u in used],
                               "baseline_gib": [round(b / GIB, 2) for b in baseline], "processes": procs}
            time.sleep(1)


def detect() -> Device:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return Device("cpu", 0, 0, 0)
    try:
        count = pynvml.nvmlDeviceGetCount()
        if not count:
            return Device("cpu", 0, 0, 0)
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
        nvml_total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
    finally:
        pynvml.nvmlShutdown()
    probe = "import json,torch; print(json.dumps(torch.cuda.mem_get_info(0)))"
    free_total = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                           check=True).stdout.strip().splitlines()[-1])
    return Device(name, count, int(free_total[1]), nvml_total, driver)
