"""Streamed requests as the gateway benchmarks send them: one stream timed (its end and its first bytes), a closed
loop of c clients, and open-loop arrivals on a seeded Poisson schedule (bench/gateway_overhead.py)."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass
class Target:
    name: str
    url: str  # base, without /v1
    model: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Sample:
    e2e: list[float]
    ttft: list[float]
    errors: int
    wall: float

    @property
    def rps(self) -> float:
        return len(self.e2e) / self.wall if self.wall else 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


async def one_stream(session: aiohttp.ClientSession, t: Target, max_tokens: int) -> tuple[float, float]:
    body = {
        "model": t.model,
        "messages": [{"role": "user", "content": "Say something."}],
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    start = time.perf_counter()
    ttft = 0.0
    async with session.post(f"{t.url}/v1/chat/completions", json=body, headers=t.headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{t.name}: HTTP {resp.status}: {(await resp.text())[:200]}")
        async for _ in resp.content.iter_any():
            if not ttft:
                ttft = time.perf_counter() - start
    return time.perf_counter() - start, ttft


async def load(t: Target, concurrency: int, requests: int | None, seconds: float | None, max_tokens: int) -> Sample:
    """Closed loop: `concurrency` clients, each sending its next request when the last one ended."""
    e2e: list[float] = []
    ttft: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds if seconds else None
    remaining = [requests or 0]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def client() -> None:
            nonlocal errors
            while True:
                if deadline is not None and time.perf_counter() >= deadline:
                    return
                if deadline is None:
                    if remaining[0] <= 0:
                        return
                    remaining[0] -= 1
                try:
                    total, first = await one_stream(session, t, max_tokens)
                    e2e.append(total)
                    ttft.append(first)
                except (aiohttp.ClientError, RuntimeError, TimeoutError):
                    errors += 1

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return Sample(e2e, ttft, errors, wall)


async def load_open(t: Target, rate: float, requests: int, seed: int, max_tokens: int) -> Sample:
    """Open loop: `requests` arrivals with exponential gaps at `rate` per second (`seed`: the same schedule for
    every target), each sent on time whether or not the earlier ones have ended."""
    rng = random.Random(seed)
    offsets, at = [], 0.0
    for _ in range(requests):
        offsets.append(at)
        at += rng.expovariate(rate)
    e2e: list[float] = []
    ttft: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        start = time.perf_counter()

        async def arrival(offset: float) -> None:
            nonlocal errors
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            try:
                total, first = await one_stream(session, t, max_tokens)
                e2e.append(total)
                ttft.append(first)
            except (aiohttp.ClientError, RuntimeError, TimeoutError):
                errors += 1

        await asyncio.gather(*(arrival(o) for o in offsets))
        wall = time.perf_counter() - start
    return Sample(e2e, ttft, errors, wall)
