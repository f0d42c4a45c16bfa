"""Where the gateway's added time to first token goes (issue 37, item 4): one stream at a time through the
gateway to the paced stand-in engine, the gateway's clock read at each step of the request path.

    .venv/bin/python bench/gateway_timeline.py [--requests 300] [--cadence-ms 1]

The gateway runs in a child process as `python -m stack.entrypoints.gateway` does, with clocks wrapped around
four of its own calls (nothing else changed): the request read (uvicorn's on_message_complete), the upstream
call (`LocalUpstream.open`: entered, returned with the engine's response headers), the first chunk read
(`Dispatcher._first_chunk`) and uvicorn's two sends (the response headers, the first body chunk). Printed:
the median of each step over the run, beside the added TTFT (through the gateway minus direct, the same client,
interleaved). Steps:

    request read -> upstream call    routing: FastAPI's route, the checks, the dispatcher's choice
    upstream call -> headers         the request written to the engine and its response headers read
    first chunk -> headers sent      the answer built, uvicorn writes the response headers
    headers sent -> first chunk sent the relay's first iteration up to uvicorn's send
    first chunk write                the send itself (a syscall)

The engine's own time (its headers, the cadence) is in the middle two; the rest is the gateway's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.children import Children  # noqa: E402
from bench.harness.waiting import free_port  # noqa: E402

PY = sys.executable
STEPS = ("request read -> upstream call", "upstream call -> headers", "first chunk -> headers sent",
         "headers sent -> first chunk sent", "first chunk write")  # fmt: skip


def instrumented_gateway(argv: list[str], out: Path) -> None:
    """Runs in the child: the gateway with clocks around its steps; the medians go to `out` at SIGTERM."""
    import runpy
    import signal

    import uvicorn.protocols.http.httptools_impl as h11

    from stack.gateway.routing import dispatcher
    from stack.gateway.upstreams import fast_path

    t: dict[str, int] = {}
    rows: list[tuple[int, ...]] = []
    clock = time.perf_counter_ns

    complete = h11.HttpToolsProtocol.on_message_complete

    def on_message_complete(self):  # type: ignore[no-untyped-def]
        t.clear()
        t["read"] = clock()
        return complete(self)

    open_ = fast_path.LocalUpstream.open

    async def open_upstream(self, dep, path, payload):  # type: ignore[no-untyped-def]
        t["open"] = clock()
        resp = await open_(self, dep, path, payload)
        t["headers"] = clock()
        return resp

    first_chunk = dispatcher.Dispatcher._first_chunk

    async def first(self, resp, dep_id):  # type: ignore[no-untyped-def]
        chunk = await first_chunk(self, resp, dep_id)
        t["first"] = clock()
        return chunk

    send = h11.RequestResponseCycle.send

    async def timed_send(self, message):  # type: ignore[no-untyped-def]
        if message["type"] == "http.response.start":
            t["start"] = clock()
        elif "start" in t and "body" not in t:
            t["body"] = clock()
            await send(self, message)
            if {"read", "open", "headers", "first"} <= set(t):
                rows.append((t["open"] - t["read"], t["headers"] - t["open"], t["start"] - t["first"],
                             t["body"] - t["start"], clock() - t["body"]))  # fmt: skip
            return
        await send(self, message)

    h11.HttpToolsProtocol.on_message_complete = on_message_complete
    fast_path.LocalUpstream.open = open_upstream
    dispatcher.Dispatcher._first_chunk = first
    h11.RequestResponseCycle.send = timed_send

    def report(*_: object) -> None:
        medians = {s: round(statistics.median(r[i] for r in rows) / 1e3, 1) for i, s in enumerate(STEPS) if rows}
        out.write_text(json.dumps({"requests": len(rows), "median_us": medians}))
        sys.exit(0)

    signal.signal(signal.SIGTERM, report)
    sys.argv = ["gateway", *argv]
    runpy.run_module("stack.entrypoints.gateway", run_name="__main__")


async def ttfts(url: str, model: str, n: int) -> list[float]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 4}
    out = []
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            t0 = time.perf_counter()
            async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                first = None
                async for line in resp.content:
                    if first is None and line.startswith(b"data: {"):
                        first = time.perf_counter() - t0
            out.append(first or float("nan"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300, help="per side, in rounds of 50 (direct, gateway)")
    ap.add_argument("--cadence-ms", type=float, default=1.0, help="the stand-in engine's ms between chunks")
    ap.add_argument("--out", type=Path, help="write the result JSON here too")
    ap.add_argument("--gateway-child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.gateway_child is not None:
        out, *argv = args.gateway_child
        instrumented_gateway(argv, Path(out))
        return
    with Children() as procs:
        mock, gw = free_port(), free_port()
        engine = procs.start("mock", [PY, "bench/harness/mock_upstream.py", "--port", str(mock), "--chunks", "4",
                                      "--delay-ms", str(args.cadence_ms), "--name", "paced"])  # fmt: skip
        steps = procs.logs / "steps.json"
        gateway = procs.start("gateway", [PY, __file__, "--gateway-child", str(steps), "--port", str(gw),
                                          "--upstream", f"paced=http://127.0.0.1:{mock}@paced"])  # fmt: skip
        engine.wait_http(f"http://127.0.0.1:{mock}/health", 30, interval=0.1)
        gateway.wait_http(f"http://127.0.0.1:{gw}/health", 60, interval=0.1)
        direct, through = [], []
        asyncio.run(ttfts(f"http://127.0.0.1:{gw}", "paced", 20))  # warm-up: connections, first-call imports
        for _ in range(max(1, args.requests // 50)):
            direct += asyncio.run(ttfts(f"http://127.0.0.1:{mock}", "paced", 50))
            through += asyncio.run(ttfts(f"http://127.0.0.1:{gw}", "paced", 50))
        procs.stop(gateway)
        result = json.loads(steps.read_text())
    result["ttft_p50_ms"] = {"direct": round(statistics.median(direct) * 1e3, 3),
                             "gateway": round(statistics.median(through) * 1e3, 3)}  # fmt: skip
    result["added_ttft_p50_ms"] = round(result["ttft_p50_ms"]["gateway"] - result["ttft_p50_ms"]["direct"], 3)
    result["cadence_ms"] = args.cadence_ms
    print(
        f"TTFT p50: direct {result['ttft_p50_ms']['direct']:.2f} ms, through the gateway "
        f"{result['ttft_p50_ms']['gateway']:.2f} ms: +{result['added_ttft_p50_ms']:.2f} ms "
        f"({result['requests']} requests timed in the gateway)"
    )
    for step, us in result["median_us"].items():
        print(f"  {step:34s} {us:8.1f} us")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
