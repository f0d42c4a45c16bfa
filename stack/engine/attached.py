"""Engines the model manager finds running and never starts or stops: the static deployment, where each
model is its own compose service (or a vLLM server someone else runs).

The manager drives them through the same Runtime protocol as LocalEngine and DockerEngine, with what it
may do to someone else's server: put it to sleep when idle or to make room, wake it on a request, and
wait for its /health. `start` wakes a sleeping engine and `stop` only stops routing to it: its process
belongs to compose (restart: unless-stopped), not to us. Sleep needs the engine started with
--enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 (GPU); `supports_sleep` asks the engine itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from stack.engine.control_client import control_client
from stack.engine.runtime import SleepEndpoints
from stack.errors import EngineError


@dataclass
class AttachedSpec:
    name: str
    base_url: str  # http://engine:8000, no /v1


class AttachedEngine(SleepEndpoints):
    runtime_kind = "attached"
    owns_process = False  # the manager cannot stop it instead of a sleep that freed too little

    def __init__(self, spec: AttachedSpec) -> None:
        self.spec = spec

    def start(self) -> int:
        """Wake it if it sleeps (a gateway restarted while it slept); nothing to start otherwise."""
        try:
            if self.is_sleeping():
                self.wake_up()
        except (httpx.HTTPError, EngineError):
            pass  # not up yet, or no sleep endpoints: wait_ready decides
        return 0

    def wait_ready(self, timeout: float) -> float:
        started = time.monotonic()
        last = "no answer"
        http = control_client()
        while (elapsed := time.monotonic() - started) <= timeout:
            try:
                resp = http.get(f"{self.spec.base_url}/health", timeout=3.0)
                if resp.status_code == 200:
                    return elapsed
                last = f"/health answered {resp.status_code}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            time.sleep(0.5)
        raise EngineError(f"engine {self.spec.name!r} at {self.spec.base_url} is not ready after {timeout:.0f} s "
                          f"({last})", hint="it is not ours to start: check its service (docker compose ps, logs)")

    def stop(self, grace: float = 20) -> list[int]:
        return []  # its process is the compose service's; the manager only stops routing to it

    def exit_code(self) -> int | None:
        return None  # compose restarts it; an unreachable engine shows up in wait_ready and in requests

    def logs(self, lines: int = 40) -> str:
        return ""  # its logs are its service's: docker compose logs

    def supports_sleep(self) -> bool:
        """The engine answers /is_sleeping only in dev mode with sleep mode on: ask it."""
        try:
            return httpx.get(f"{self.spec.base_url}/is_sleeping", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False
