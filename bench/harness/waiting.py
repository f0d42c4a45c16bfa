"""Free ports and waiting for processes and endpoints: one copy of each helper, for the benchmarks and the tests."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], bool], timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not met in time"
        time.sleep(0.1)


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None,
              headers: dict[str, str] | None = None, ok: Callable[[int], bool] = lambda status: status < 500,
              interval: float = 0.3) -> float:
    """Until `url` answers with a status `ok` accepts (default: below 500); the seconds it took. RuntimeError
    with the end of `log` if `proc` exits first, TimeoutError after `timeout`."""
    start = time.monotonic()
    deadline = start + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"process exited ({proc.returncode}) before {url} answered:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if ok(httpx.get(url, headers=headers, timeout=2).status_code):
                return time.monotonic() - start
        time.sleep(interval)
    raise TimeoutError(f"{url} not up after {timeout:.0f} s")


def first_token(base_url: str, model: str, deadline: float, request_timeout: float = 30, poll_s: float = 0.25) -> float:
    """Poll with a streamed 1-token request until one content chunk arrives; returns when it did (monotonic)."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "stream": True}
    while time.monotonic() < deadline:
        try:
            with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=request_timeout) as resp:
                if resp.status_code == 200:
                    for line in resp.iter_lines():
                        if line.startswith("data:") and '"content"' in line:
                            return time.monotonic()
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    raise TimeoutError(f"no first token from {base_url} before the deadline")
