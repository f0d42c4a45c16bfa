"""Load-test helpers: scenario files, synthetic request records, and the real `vstack` CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from bench.harness.waiting import free_port
from stack.load.measured_requests import RequestRecord

DATA = Path(__file__).parent / "data"
# Small enough for a 2-core machine shared with others: a few short requests, two users.
TINY_SCENARIO = """\
name: tiny
description: tests only
load: {users: 2, ramp_s: 0, duration_s: 8}
requests:
  stream: 0.75
  prompt_tokens: {dist: uniform, min: 24, max: 48}
  output_tokens: 8
slo: ["p95_ttft_ms<60000", "error_rate<0.5"]
tune: {num_prompts: 6}
"""


def write_scenario(folder: Path, text: str = TINY_SCENARIO, name: str = "tiny.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def record(start: float, e2e: float, ttft: float | None = None, itl: list[float] | None = None, out: int = 8,
           ok: bool = True, model: str = "m", status: int = 200, error: str = "") -> RequestRecord:
    return RequestRecord(start=start, model=model, stream=ttft is not None, ok=ok, e2e_ms=e2e, ttft_ms=ttft,
                         itl_ms=itl or [], prompt_tokens=32, output_tokens=out, status=status, error=error)


class Vstack:
    """The real CLI with its own state folder, a free gateway port and eager (uncompiled) engines."""

    def __init__(self, tmp: Path) -> None:
        self.env = {**{k: v for k, v in os.environ.items() if not k.upper().startswith("VSTACK_")},
                    "VSTACK_STATE_DIR": str(tmp / "state"), "VSTACK_PORT": "0",
                    "VSTACK_GATEWAY__PORT": str(free_port()), "VSTACK_ENGINE__ENFORCE_EAGER": "true",
                    "COLUMNS": "200"}

    def __call__(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stack.entrypoints.cli", *args], env=self.env, text=True,
                              capture_output=True, timeout=timeout, check=False)


@pytest.fixture
def vstack(tmp_path: Path) -> Vstack:
    return Vstack(tmp_path)


def serving_processes(marker: str) -> list[int]:
    """Pids of processes whose command line contains marker (an engine's port, a tune's folder)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.info["pid"])
        except psutil.Error:
            continue
    return found


def stop_locust(bench_load: subprocess.Popen[str]) -> None:
    """End the Locust run a `vstack bench load` process drives before its --duration, as its run time would:
    SIGTERM makes Locust stop its users (those in a request finish it, within --stop-timeout) and exit 0, and
    `bench load` then writes its report. Nothing to do where the run already ended."""
    if bench_load.poll() is not None:
        return
    children = [c for c in psutil.Process(bench_load.pid).children(recursive=True)
                if "locust" in " ".join(c.cmdline())]
    assert children, "no Locust process under `vstack bench load`"
    for child in children:
        child.terminate()
