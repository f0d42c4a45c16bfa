"""A stream a gateway worker relays (gateway.workers: 2; adr/0049) from an engine that stops mid-stream: the
owner's liveness watch finds it (no /health answer) and cuts the stream, and the worker ends it with the reason,
as one process does (tests/gateway/test_liveness.py). The engine is the mock OpenAI server, stopped with SIGSTOP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from bench.harness.waiting import free_port, wait_http
from tests.gateway.conftest import ROOT, start_mock, stop

pytestmark = [pytest.mark.solo, pytest.mark.lifecycle]
CONFIG = """\
gateway:
  liveness: {probe_interval_s: 0.5, probe_timeout_s: 1, probe_failures: 2, stall_s: 2}
"""


def test_a_worker_relaying_a_stream_from_an_engine_that_stopped_ends_it_with_the_reason(tmp_path) -> None:
    eng = start_mock(tmp_path, "eng", "--chunks", "200", "--delay-ms", "100")
    (tmp_path / "config.yaml").write_text(CONFIG + f"state_dir: {tmp_path / 'state'}\n")
    port, log = free_port(), tmp_path / "gateway.log"
    argv = [sys.executable, "-m", "stack.entrypoints.gateway", "--workers", "2", "--port", str(port),
            "--config", str(tmp_path / "config.yaml"), "--upstream", f"eng={eng.url}"]  # fmt: skip
    with log.open("wb") as out:
        gw = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", 60, gw, log)
        body = {"model": "eng", "messages": [{"role": "user", "content": "x"}], "stream": True}
        events, worker = [], None
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
            worker = r.headers.get("x-vstack-worker")
            t0 = time.monotonic()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                if len(events) == 3:  # streaming: the engine stops
                    os.killpg(eng.proc.pid, signal.SIGSTOP)
                    t0 = time.monotonic()
            ended_after = time.monotonic() - t0
        assert worker in ("1", "2"), worker  # a worker relayed it
        last = json.loads(events[-1][6:])
        assert last["error"]["code"] == "engine_stalled", last
        assert "stopped making progress" in last["error"]["message"], last
        assert ended_after < 15, ended_after  # liveness: 2 failed probes 0.5 s apart, not the request timeout
    finally:
        os.killpg(eng.proc.pid, signal.SIGCONT)
        stop(eng.proc)
        stop(gw)
