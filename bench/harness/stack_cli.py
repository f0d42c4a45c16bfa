"""A whole stack through the real `vstack` CLI in a subprocess (`vstack up`, `status`, `down`), as a user runs
it: with its own state folder and environment, or a `--config` overlay; and the processes it leaves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

from bench.harness.children import ROOT


class Vstack:
    """`vstack(*args)` runs `python -m stack.entrypoints.cli [--config CONFIG] ARGS` from the repository root."""

    def __init__(self, state_dir: Path | None = None, extra_env: dict[str, str] | None = None,
                 config: Path | None = None) -> None:
        self.env = {**os.environ, **({"VSTACK_STATE_DIR": str(state_dir)} if state_dir else {}), **(extra_env or {})}
        self.config = config

    def __call__(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        config = ["--config", str(self.config)] if self.config else []
        return subprocess.run([sys.executable, "-m", "stack.entrypoints.cli", *config, *args], env=self.env,
                              text=True, capture_output=True, timeout=timeout, check=False, cwd=ROOT)

    def status(self) -> list[dict]:
        proc = self("status", "--json", timeout=60)
        if proc.returncode:
            raise RuntimeError(f"vstack status failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return json.loads(proc.stdout)


def family(pid: int) -> list[psutil.Process]:
    """A process, its descendants and its process group: everything `vstack down` must stop."""
    procs = {}
    try:
        root = psutil.Process(pid)
        procs = {p.pid: p for p in [root, *root.children(recursive=True)]}
        pgid = os.getpgid(pid)
        for p in psutil.process_iter():
            try:
                if os.getpgid(p.pid) == pgid:
                    procs[p.pid] = p
            except (ProcessLookupError, psutil.Error):
                pass
    except (psutil.Error, ProcessLookupError):
        pass
    return list(procs.values())


def alive(procs: list[psutil.Process]) -> list[int]:
    return [p.pid for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
