"""Waiting for processes and ports in tests: one copy of each helper (uvicorn's tests/utils.py style)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not met in time"
        time.sleep(0.1)


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    """Until `url` (a /health) answers below 500; RuntimeError with the log's end if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"process exited ({proc.returncode}) before {url} answered:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code < 500:
                return
        time.sleep(0.3)
    raise TimeoutError(f"{url} not up after {timeout:.0f} s")
