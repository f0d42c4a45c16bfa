"""The real `vstack` CLI in a subprocess with its own state folder, and the processes it leaves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest


class Vstack:
    def __init__(self, state_dir: Path, extra_env: dict[str, str] | None = None) -> None:
        self.env = {**os.environ, "VSTACK_STATE_DIR": str(state_dir), **(extra_env or {})}

    def __call__(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stack.entrypoints.cli", *args], env=self.env, text=True,
                              capture_output=True, timeout=timeout, check=False)

    def status(self) -> list[dict]:
        proc = self("status", "--json", timeout=60)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)


@pytest.fixture
def vstack(tmp_path: Path) -> Vstack:
    # The gateway on a free port (the engine always takes a free loopback port behind it).
    env = {"VSTACK_PORT": "0", "VSTACK_GATEWAY__PORT": "0", "VSTACK_GATEWAY__HOST": "127.0.0.1"}
    return Vstack(tmp_path / "state", env)


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
