"""Child processes of a benchmark (vLLM engines, gateways, LiteLLM, stand-ins): each in its own session with its
log in one folder, stopped as a whole process tree by the stack's own `stop_process_tree` (SIGTERM to the group,
a grace period, then SIGKILL), whether the run ends or fails."""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.harness.waiting import wait_http
from stack.engine.process import stop_process_tree

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Child:
    name: str
    popen: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def wait_http(self, url: str, timeout: float, **kwargs) -> float:
        """Until `url` answers; fails early, with this child's log, if the child exits first."""
        return wait_http(url, timeout, proc=self.popen, log=self.log, **kwargs)

    def stop(self, grace: float = 15) -> list[int]:
        """The whole tree; the pids still alive afterwards (should be [])."""
        left = stop_process_tree(self.pid, grace)
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            left = [*left, self.pid]
        return left


class Children:
    """Starts children and stops every one still running on `stop_all` or when its `with` block ends."""

    def __init__(self, logs: Path | None = None, grace: float = 15) -> None:
        self.logs = logs or Path(tempfile.mkdtemp(prefix="vstack-bench-"))
        self.logs.mkdir(parents=True, exist_ok=True)
        self.grace = grace
        self.started: list[Child] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
              log: Path | None = None) -> Child:
        """`argv` in a session of its own, stdout and stderr to `log` (default LOGS/NAME.log), `env` over ours."""
        path = log or self.logs / f"{name}.log"
        with path.open("ab") as out:  # the child holds its own descriptor
            popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd or ROOT,
                                     env={**os.environ, **(env or {})}, start_new_session=True)
        child = Child(name, popen, path)
        self.started.append(child)
        return child

    def stop(self, child: Child) -> list[int]:
        if child in self.started:
            self.started.remove(child)
        return child.stop(self.grace)

    def stop_all(self) -> list[int]:
        left: list[int] = []
        while self.started:
            left += self.stop(self.started[-1])
        return left

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
