"""One vLLM engine as a child process: start, wait until /health answers, stop the whole process tree.

The engine runs in its own session (process group), so stopping it reaches the API server, the engine core
and any compile workers: SIGTERM to the group, a grace period, then SIGKILL to whatever is left. Being in
its own session, it also outlives a gateway killed with SIGKILL: with a RecordStore its record (pid, port,
fingerprint of its command) is written when it is spawned and removed when it is stopped, and a later
gateway re-attaches it (`kept`, set by stack.engine.kept) instead of starting a twin beside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from stack.engine.control_client import control_client
from stack.engine.diagnose import disk_hint, exit_words, explain_failure, log_silence, log_tail
from stack.engine.popen import Started, launch, open_log
from stack.engine.records import EngineRecord, RecordStore
from stack.engine_env import engine_environ
from stack.errors import EngineError

HEALTH_POLL_S = 0.1  # /health polls while an engine starts: it is seen ready within this


@dataclass
class EngineSpec:
    """Everything needed to start one engine; `display_argv` has secrets redacted. `api_key`: the engine's
    credential (VLLM_API_KEY in its environment, never in argv); `drop_env`: more variables of ours it must
    not inherit (the config's key variables; stack.engine_env strips the usual ones)."""

    name: str
    profile: str
    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    log_path: Path
    display_argv: list[str] = field(default_factory=list)
    api_key: str | None = field(default=None, repr=False)
    drop_env: tuple[str, ...] = ()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


class EngineProcess:
    runtime_kind = "process"
    owns_process = True

    def __init__(self, spec: EngineSpec, records: RecordStore | None = None, fingerprint: str = "") -> None:
        self.spec = spec
        self.popen: Started | None = None
        self.log_start = 0  # this run's first byte in the (appended) log: earlier runs' lines are never shown
        self.records, self.fingerprint = records, fingerprint
        self.kept: EngineRecord | None = None  # a running engine an earlier gateway started, re-attached
        self.prestarted = False  # spawned ahead of the manager's first start (stack.assemble.runtimes.start_early)

    @property
    def pid(self) -> int | None:
        if self.popen is not None:
            return self.popen.pid
        return self.kept.pid if self.kept else None

    def start(self) -> int:
        """Spawn the engine; returns its pid. Spawns nothing for an engine already running: one started early
        (the gateway's own imports overlap its start) or a kept one (re-attached); a kept one that has
        exited since is started fresh."""
        if self.popen is not None and (self.prestarted or self.popen.poll() is None):
            self.prestarted = False  # started early: this first start is that one, even if it has exited
            return self.popen.pid  # (wait_ready then reports its exit, with its log)
        if self.kept is not None:
            if self.kept.alive():
                self.save_record(self.kept.pid, self.kept.started_at)
                return self.kept.pid
            self.kept = None
        try:
            log, self.log_start = open_log(self.spec.log_path, self.spec.display_argv)
        except OSError as exc:  # a full disk, a read-only state_dir: said now, not as a start that never ends
            raise EngineError(f"engine {self.spec.name!r}: cannot write its log {self.spec.log_path}: "
                              f"{exc.strerror or type(exc).__name__}", hint=disk_hint(self.spec.log_path)) from None
        with log:
            environ = engine_environ({**self.spec.env, "PYTHONUNBUFFERED": "1"}, self.spec.api_key, self.spec.drop_env)
            self.popen = launch(self.spec.argv, log, environ)
        self.save_record(self.popen.pid, time.time())
        return self.popen.pid

    def save_record(self, pid: int, started_at: float) -> None:
        if self.records is not None:
            asleep = (self.kept.asleep, self.kept.host_bytes) if self.kept is not None else (0, 0)
            self.records.save(EngineRecord(self.spec.name, self.spec.profile, pid, self.spec.host, self.spec.port,
                                           str(self.spec.log_path), self.spec.display_argv, started_at,
                                           self.fingerprint, os.getpid(), time.time(),
                                           api_key=self.spec.api_key or "", asleep=asleep[0],
                                           host_bytes=asleep[1]))  # fmt: skip

    def mark_asleep(self, level: int, host_bytes: int = 0) -> None:
        """Write into its record that it sleeps at `level` (0: awake again) holding `host_bytes` of host RAM: a
        gateway that re-attaches it later wakes it before serving it (adr/0030)."""
        record = self.records.get(self.spec.name) if self.records is not None else None
        if record is None or record.pid != self.pid or (record.asleep, record.host_bytes) == (level, host_bytes):
            return
        self.records.save(dataclasses.replace(record, asleep=level, host_bytes=host_bytes))  # type: ignore[union-attr]
        if self.kept is not None:
            self.kept = dataclasses.replace(self.kept, asleep=level, host_bytes=host_bytes)

    def exit_code(self) -> int | None:
        if self.popen is not None:
            return self.popen.poll()
        if self.kept is not None:  # not our child: its exit code went to whoever reaped it
            return None if self.kept.alive() else -1
        return None

    def wait_ready(self, timeout: float, on_tick: Callable[[float, str], None] = lambda *_: None) -> float:
        """Seconds until /health answered 200. On a crash or timeout: stop everything, raise EngineError."""
        started = time.monotonic()
        url = f"{self.spec.base_url}/health"
        client = control_client()  # one for every control call: stack.engine.control_client
        while True:
            elapsed = time.monotonic() - started
            code = self.exit_code()
            if code is not None:
                tail = log_tail(self.spec.log_path, start=self.log_start)
                self.stop(grace=5)
                message, hint = explain_failure(tail, code)
                # The cause from the process itself: its exit, and why its log may say nothing.
                silent = log_silence(self.spec.log_path, tail)
                raise EngineError(f"engine {self.spec.name!r} {exit_words(code)} while starting: {message}"
                                  + (f"; {silent}" if silent else ""),
                                  hint=disk_hint(self.spec.log_path) if "full" in silent else hint,
                                  log_tail=tail)  # fmt: skip
            if elapsed > timeout:
                tail = log_tail(self.spec.log_path, start=self.log_start)
                self.stop(grace=5)
                raise EngineError(f"engine {self.spec.name!r} was not ready after {timeout:.0f} s; stopped it",
                                  hint="raise startup_timeout_s, or read the log: " + str(self.spec.log_path),
                                  log_tail=tail)
            try:
                if client.get(url, timeout=2.0).status_code == 200:
                    return elapsed
            except httpx.HTTPError:
                pass
            on_tick(elapsed, last_line(self.spec.log_path))
            time.sleep(HEALTH_POLL_S)

    def stop(self, grace: float = 20) -> list[int]:
        pid = self.pid
        if pid is None:
            return []
        left = stop_process_tree(pid, grace)
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=1)
        if self.records is not None and not left:
            self.records.remove(self.spec.name)
        return left


def last_line(path: Path) -> str:
    lines = log_tail(path, 3).splitlines()
    return lines[-1][-160:] if lines else ""


def group_members(pgid: int) -> list[psutil.Process]:
    """The running processes of process group `pgid`."""
    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def stop_process_tree(pid: int, grace: float) -> list[int]:
    """Stop pid, its descendants and its process group. Returns pids still alive afterwards (should be [])."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        pgid = pid  # the leader is gone; its group id is its pid (we started it with start_new_session)
    members = {p.pid: p for p in [*family, *group_members(pgid)]}
    if not members:
        return []
    for proc in members.values():
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(list(members.values()), timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    _, alive = psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in alive]
