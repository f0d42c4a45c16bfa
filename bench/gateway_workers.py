"""The gateway at a burst of streams that start together, with 1 process vs N worker processes, in one run.

    .venv/bin/python bench/gateway_workers.py                          # 256 streams, workers 1 and 2
    .venv/bin/python bench/gateway_workers.py --workers 1,2,4 --streams 512 --rounds 5

Issue 54: when 256 streams start together, one event loop takes them one after another, and the last first
token waits for every other request's work before its upstream call. Each round sends `--streams` streamed chat
requests at once (fresh connections, as a benchmark client's first wave) to each target in turn: the stand-in
engine directly (bench/harness/mock_upstream.py, paced: `--chunks` one-token chunks `--cadence-ms` apart), then
the gateway (`python -m stack.entrypoints.gateway`, local fast path) with each `--workers` count. Rounds are
interleaved so that drift hits every target alike. Per target: relayed tokens/s (the completion tokens of
every stream of a burst over the burst's wall time), TTFT p50/p99 over every round's streams, and the gateway's
CPU seconds (owner and workers together) per 1,000 tokens, and the owner's own CPU per request (with workers it
decides every request, the one serial point at a burst: adr/0049); ratios are against workers=1.

On a machine with few cores the stand-in engine, the client and the gateway's processes share them: a second
worker competes with the others for the same cores, and the figures say what that costs or gains here; on the
GPU host (bench/gpu/gateway_pace.sh) the engine runs on the GPU and the gateway has cores of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.children import Children  # noqa: E402
from bench.harness.relay_clients import cpu_of  # noqa: E402
from bench.harness.stream_load import pct  # noqa: E402
from bench.harness.waiting import free_port, wait_http  # noqa: E402

PY = sys.executable


@dataclass
class Result:
    name: str
    pid: int | None = None  # the gateway's (its workers are its children); None: the stand-in directly
    ttft: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    tokens: int = 0
    cpu_s: float = 0.0
    owner_cpu_s: float = 0.0  # the owner process alone: with workers, the one serial point (adr/0049)
    requests: int = 0
    errors: int = 0


async def one(session: aiohttp.ClientSession, url: str, chunks: int) -> tuple[float, int]:
    """(TTFT, completion tokens) of one stream; the stand-in answers one token per chunk."""
    body = {"model": "m", "messages": [{"role": "user", "content": "Say something."}], "stream": True,
            "max_tokens": chunks, "stream_options": {"include_usage": True}}  # fmt: skip
    start, ttft, tokens = time.perf_counter(), 0.0, 0
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}")
        async for line in resp.content:
            if not ttft:
                ttft = time.perf_counter() - start
            if line.startswith(b"data: {") and b'"usage"' in line and b'"completion_tokens"' in line:
                tokens = json.loads(line[6:]).get("usage", {}).get("completion_tokens", 0)
    return ttft, tokens


async def burst(r: Result, url: str, streams: int, chunks: int) -> None:
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    cpu = cpu_of(r.pid) if r.pid else 0.0
    owner = cpu_of(r.pid, children=False) if r.pid else 0.0
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        start = time.perf_counter()
        done = await asyncio.gather(*(one(session, url, chunks) for _ in range(streams)), return_exceptions=True)
        wall = time.perf_counter() - start
    ok = [d for d in done if isinstance(d, tuple)]
    r.errors += len(done) - len(ok)
    r.ttft += [t for t, _ in ok]
    tokens = sum(n for _, n in ok)
    r.tokens += tokens
    r.tokens_per_s.append(tokens / wall)
    r.requests += streams
    if r.pid:
        r.cpu_s += cpu_of(r.pid) - cpu
        r.owner_cpu_s += cpu_of(r.pid, children=False) - owner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1,2", help="comma-separated gateway.workers counts (default 1,2)")
    ap.add_argument("--streams", type=int, default=256, help="streams started together per burst")
    ap.add_argument("--chunks", type=int, default=64, help="tokens per stream (one per chunk)")
    ap.add_argument("--cadence-ms", type=float, default=20, help="the stand-in's gap between chunks")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    with Children() as kids:
        up = free_port()
        mock = kids.start("mock", [PY, "bench/harness/mock_upstream.py", "--port", str(up), "--chunks",
                                   str(args.chunks), "--delay-ms", str(args.cadence_ms)])  # fmt: skip
        wait_http(f"http://127.0.0.1:{up}/v1/models", 30, mock.popen, mock.log)
        targets = [(Result("direct"), f"http://127.0.0.1:{up}")]
        for w in counts:
            port = free_port()
            gw = kids.start(f"gateway-w{w}", [PY, "-m", "stack.entrypoints.gateway", "--upstream",
                                              f"m=http://127.0.0.1:{up}", "--port", str(port), "--workers", str(w)],
                            env={"PYTHONPATH": str(ROOT)})  # fmt: skip
            wait_http(f"http://127.0.0.1:{port}/health", 60, gw.popen, gw.log)
            targets.append((Result(f"workers={w}", gw.popen.pid), f"http://127.0.0.1:{port}"))
        time.sleep(3)  # the workers have connected to their owner
        for r, url in targets:  # warm-up: imports, connection pools
            asyncio.run(burst(Result(r.name), url, 16, args.chunks))
        for _ in range(args.rounds):
            for r, url in targets:
                asyncio.run(burst(r, url, args.streams, args.chunks))
                time.sleep(1)
    report(targets, args)


def report(targets: list[tuple[Result, str]], args: argparse.Namespace) -> None:
    base = next((r for r, _ in targets if r.name == "workers=1"), None)
    print(f"\n{args.streams} streams started together x {args.rounds} rounds, {args.chunks} tokens each, "
          f"{args.cadence_ms:g} ms apart; {os.cpu_count()} CPU cores")  # fmt: skip
    print(f"{'target':<11} {'tok/s':>9} {'x w=1':>6} {'TTFT p50':>10} {'x w=1':>6} {'TTFT p99':>10} {'x w=1':>6} "
          f"{'CPU s/1k tok':>12} {'owner ms/req':>12} {'errors':>6}")  # fmt: skip
    rows = []
    for r, _ in targets:
        tps = sum(r.tokens_per_s) / len(r.tokens_per_s) if r.tokens_per_s else 0.0
        p50, p99 = pct(r.ttft, 50) * 1000, pct(r.ttft, 99) * 1000
        cpu = r.cpu_s / r.tokens * 1000 if r.pid and r.tokens else float("nan")
        owner = r.owner_cpu_s / r.requests * 1000 if r.pid and r.requests else float("nan")
        row = {"target": r.name, "tokens_per_s": tps, "ttft_p50_ms": p50, "ttft_p99_ms": p99,
               "cpu_s_per_1k_tokens": cpu, "owner_cpu_ms_per_request": owner, "errors": r.errors}  # fmt: skip
        rows.append(row)
        if base is not None and base.tokens_per_s:
            b_tps = sum(base.tokens_per_s) / len(base.tokens_per_s)
            ratios = (tps / b_tps, p50 / (pct(base.ttft, 50) * 1000), p99 / (pct(base.ttft, 99) * 1000))
        else:
            ratios = (float("nan"),) * 3
        print(f"{r.name:<11} {tps:>9,.0f} {ratios[0]:>6.2f} {p50:>8.1f}ms {ratios[1]:>6.2f} {p99:>8.1f}ms "
              f"{ratios[2]:>6.2f} {cpu:>12.3f} {owner:>12.3f} {r.errors:>6}")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
