"""bench/gateway_overhead.py's open-loop arrivals and its HTTP floor (bench/harness/http_floor.py), against the
paced stand-in upstream (bench/harness/mock_upstream.py: the bench's own stand-in engine; no vLLM needed to
check what the bench measures)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from bench.harness.children import Children
from bench.harness.stream_load import Target, load, load_open
from bench.harness.waiting import free_port

CHUNKS, CADENCE_MS = 5, 20  # a 0.1 s stream


@pytest.fixture(scope="module")
def upstreams():
    with Children() as procs:
        paced, floor = free_port(), free_port()
        mock = procs.start("paced", [sys.executable, "bench/harness/mock_upstream.py", "--chunks", str(CHUNKS),
                                     "--port", str(paced), "--delay-ms", str(CADENCE_MS), "--name", "paced"])
        proxy = procs.start("http-floor", [sys.executable, "bench/harness/http_floor.py", "--port", str(floor),
                                           "--target", f"http://127.0.0.1:{paced}"])
        mock.wait_http(f"http://127.0.0.1:{paced}/health", 30, interval=0.2)
        proxy.wait_http(f"http://127.0.0.1:{floor}/health", 60, interval=0.2)
        yield Target("direct", f"http://127.0.0.1:{paced}", "paced"), Target("floor", f"http://127.0.0.1:{floor}",
                                                                               "paced")


def test_open_loop_sends_on_schedule_so_requests_overlap_beyond_the_closed_loops_one(upstreams) -> None:
    direct, _ = upstreams
    # 20 arrivals at 40/s over ~0.5 s, each stream 0.1 s long: open loop, several are in flight at once,
    # so the whole run takes about the schedule's length, far less than 20 streams one after another (2 s).
    s = asyncio.run(load_open(direct, 40.0, 20, seed=1, max_tokens=CHUNKS))
    assert s.errors == 0 and len(s.e2e) == 20
    assert min(s.e2e) >= CHUNKS * CADENCE_MS / 1e3 * 0.9
    assert s.wall < 1.5, s.wall
    closed = asyncio.run(load(direct, 1, 5, None, CHUNKS))
    assert closed.wall >= 5 * CHUNKS * CADENCE_MS / 1e3 * 0.9  # closed loop, one stream: one after another


def test_the_http_floor_relays_the_upstreams_stream_byte_for_byte(upstreams) -> None:
    import httpx

    direct, floor = upstreams
    body = {"model": "paced", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": CHUNKS}
    with httpx.Client(timeout=30) as client:
        a = client.post(f"{direct.url}/v1/chat/completions", json=body)
        b = client.post(f"{floor.url}/v1/chat/completions", json=body)
    assert a.status_code == b.status_code == 200
    assert b.text.count("data: ") == a.text.count("data: ") >= CHUNKS and b.text.rstrip().endswith("data: [DONE]")
