"""The gateway's own CPU time per streamed request (user + system of its process / requests), for two checkouts
side by side in interleaved rounds: a figure that the other processes sharing the cores disturb far less than
the added latency of bench/gateway_overhead.py does.

    .venv/bin/python bench/gateway_cpu.py --trees ../old,. --rounds 3 --requests 400 --concurrency 8

Each tree's gateway (`python -m stack.entrypoints.gateway`, local fast path) runs in its own process in front of
one unpaced local OpenAI-compatible stand-in (bench/harness/mock_upstream.py, 20 chunks per answer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gateway(tree: Path, upstream: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(tree), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.Popen([sys.executable, "-m", "stack.entrypoints.gateway", "--upstream",
                             f"m=http://127.0.0.1:{upstream}", "--port", str(port)], cwd=tree, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    return proc, port


async def drive(url: str, n: int, c: int) -> list[float]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 20}
    todo, lat = iter(range(n)), []
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            for _ in todo:
                t = time.perf_counter()
                async with session.post(url, json=body) as resp:
                    async for _chunk in resp.content:
                        pass
                lat.append(time.perf_counter() - t)

        await asyncio.gather(*(worker() for _ in range(c)))
    return sorted(lat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", required=True, help="comma-separated checkouts of this repository")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--settle", type=float, default=20, help="seconds after the gateways answer before measuring "
                    "(a gateway imports LiteLLM on a thread once it serves)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    upstream = free_port()
    mock = subprocess.Popen([sys.executable, "bench/harness/mock_upstream.py", "--port", str(upstream), "--chunks",
                             "20"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(2)
    gateways = {t: start_gateway(t, upstream) for t in trees}
    time.sleep(args.settle)
    cpu: dict[Path, list[float]] = {t: [] for t in trees}
    lat: dict[Path, list[float]] = {t: [] for t in trees}
    try:
        for _tree, (_proc, port) in gateways.items():  # warm-up: connections, imports
            asyncio.run(drive(f"http://127.0.0.1:{port}/v1/chat/completions", 100, 4))
        for _ in range(args.rounds):
            for tree, (proc, port) in gateways.items():
                before = psutil.Process(proc.pid).cpu_times()
                lat[tree] += asyncio.run(drive(f"http://127.0.0.1:{port}/v1/chat/completions", args.requests,
                                               args.concurrency))  # fmt: skip
                after = psutil.Process(proc.pid).cpu_times()
                used = after.user + after.system - before.user - before.system
                cpu[tree].append(round(used / args.requests * 1e3, 3))
    finally:
        for proc, _port in gateways.values():
            proc.terminate()
        mock.terminate()
    result = {"concurrency": args.concurrency, "requests_per_round": args.requests, "trees": {}}
    for tree in trees:
        ls = sorted(lat[tree])
        result["trees"][str(tree)] = {"cpu_ms_per_request": cpu[tree], "min_cpu_ms": min(cpu[tree]),
                                      "e2e_p50_ms": round(ls[len(ls) // 2] * 1e3, 2),
                                      "e2e_p99_ms": round(ls[int(len(ls) * 0.99)] * 1e3, 2)}  # fmt: skip
        print(f"{tree}: CPU ms per request {cpu[tree]} (min {min(cpu[tree])}); e2e p50 "
              f"{result['trees'][str(tree)]['e2e_p50_ms']} ms, p99 {result['trees'][str(tree)]['e2e_p99_ms']} ms")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
