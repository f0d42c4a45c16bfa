"""The facts a benchmark figure must carry to mean anything: which machine, which vLLM, when."""

from __future__ import annotations

import datetime as dt
import os
import platform
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def vllm_version() -> str:
    from stack.vllm.launcher import installed_vllm

    found = installed_vllm()
    return f"{found[0]} {found[1]}" if found else "not installed"


def machine_facts() -> dict[str, Any]:
    """Host, CPU, RAM, GPUs (NVML), vLLM and the time, for every JSON result."""
    from stack.hardware import GIB, detect

    info = detect()
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "time_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "ram_gib": round(info.ram_total / GIB, 1),
        "gpus": [f"{g.name} ({g.memory_total / GIB:.0f} GiB)" for g in info.gpus],
        "vllm": vllm_version(),
    }


def describe(facts: dict[str, Any]) -> str:
    """One line: `1x NVIDIA H200 (140 GiB), vllm 0.26.0, 2026-11-21` or the CPU equivalent."""
    gpus = facts.get("gpus") or []
    if gpus:
        hw = f"{len(gpus)}x {gpus[0]}"
    else:
        hw = f"{facts.get('cpu', 'CPU')} ({facts.get('cpu_cores')} cores, {facts.get('ram_gib')} GiB RAM)"
    return f"{hw}, {facts.get('vllm')}, {facts.get('date')}"
