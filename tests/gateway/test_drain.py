"""SIGTERM drains: a stream in flight finishes, new connections are refused, the process exits."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

from bench.harness.waiting import free_port, wait_http

from .conftest import ROOT, start_mock, stop


def test_sigterm_lets_the_open_stream_finish(tmp_path) -> None:
    mock = start_mock(tmp_path, "slow", "--chunks", "20", "--delay-ms", "100")  # a 2 s stream
    port = free_port()
    log = tmp_path / "gateway.log"
    argv = [sys.executable, "-m", "stack.entrypoints.gateway", "--port", str(port), "--upstream", f"smol={mock.url}"]
    gw = subprocess.Popen(argv, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 60, gw, log)
        body = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        events = []
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            events.append(next(lines))
            gw.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            with pytest.raises(httpx.ConnectError):  # draining: no new connections
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
            events.extend(line for line in lines if line)
        assert events[-1] == "data: [DONE]"
        assert sum(1 for e in events if '"content":"tok ' in e) == 20
        assert gw.wait(15) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a clean drain
    finally:
        stop(gw)
        stop(mock.proc)
