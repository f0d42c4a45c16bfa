"""An in-memory engine for the model manager's decision logic: the Runtime protocol (stack.engine.runtime)
with a start that takes `start_s` and nothing behind it.

What it stands in for is a model switch's cost, not an engine's answers: bench/switch_scheduler.py and
tests/manager/test_scheduling.py drive the real ModelManager with two of them sharing a machine that holds
one, and serve each admitted request by waiting (a GPU engine's batch: concurrent requests do not slow each
other at these rates). Real engines and a real gateway replay the same trace on the GPU
(bench/gpu/switch_scheduler.sh).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass
class StandInSpec:
    name: str
    base_url: str = "http://127.0.0.1:9"  # never called


class StandInEngine:
    runtime_kind = "stand-in"
    owns_process = True

    def __init__(self, name: str, start_s: float) -> None:
        self.spec = StandInSpec(name)
        self.start_s = start_s
        self.running = False
        self.starts = self.stops = 0
        self._lock = threading.Lock()

    def start(self) -> int:
        with self._lock:
            self.starts += 1
            self.running = True
        return 10_000 + self.starts

    def wait_ready(self, timeout: float) -> float:
        time.sleep(self.start_s)
        return self.start_s

    def stop(self, grace: float = 20) -> list[int]:
        with self._lock:
            self.stops += int(self.running)
            self.running = False
        return []

    def exit_code(self) -> int | None:
        return None if self.running else 0

    def sleep(self, level: int = 1, timeout: float = 120) -> None:
        raise NotImplementedError("the stand-in has no sleep mode: the manager stops and starts it")

    def wake_up(self, tags: list[str] | None = None, timeout: float = 120) -> None:
        raise NotImplementedError("the stand-in has no sleep mode")

    def reload_weights(self, timeout: float = 600) -> None:
        raise NotImplementedError("the stand-in has no sleep mode")

    def is_sleeping(self) -> bool:
        return False

    def logs(self, lines: int = 40) -> str:
        return f"{self.spec.name}: a stand-in engine (bench.harness.standin_engine)"
