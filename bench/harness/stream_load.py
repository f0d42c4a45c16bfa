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
    e2e: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    errors: int = 0
    wall: float = 0.0

    @property
    def rps(self) -> float:
        return len(self.e2e) / self.wall if self.wall else 0.0

    def __add__(self, other: Sample) -> Sample:
        """Two runs' requests as one sample (the rounds of a target)."""
        return Sample(self.e2e + other.e2e, self.ttft + other.ttft, self.errors + other.errors,
                      self.wall + other.wall)  # fmt: skip

    async def stream(self, session: aiohttp.ClientSession, t: Target, max_tokens: int) -> None:
        """One stream, timed into this sample (or counted as an error)."""
        try:
            total, first = await one_stream(session, t, max_tokens)
        except (aiohttp.ClientError, RuntimeError, TimeoutError):
            self.errors += 1
            return
        self.e2e.append(total)
        self.ttft.append(first)


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
    sample = Sample()
    deadline = time.perf_counter() + seconds if seconds else None
    remaining = [requests or 0]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def client() -> None:
            while True:
                if deadline is not None and time.perf_counter() >= deadline:
                    return
                if deadline is None:
                    if remaining[0] <= 0:
                        return
                    remaining[0] -= 1
                await sample.stream(session, t, max_tokens)

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        sample.wall = time.perf_counter() - start
    return sample


async def load_open(t: Target, rate: float, requests: int, seed: int, max_tokens: int) -> Sample:
    """Open loop: `requests` arrivals with exponential gaps at `rate` per second (`seed`: the same schedule for
    every target), each sent on time whether or not the earlier ones have ended."""
    rng = random.Random(seed)
    offsets, at = [], 0.0
    for _ in range(requests):
        offsets.append(at)
        at += rng.expovariate(rate)
    sample = Sample()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        start = time.perf_counter()

        async def arrival(offset: float) -> None:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            await sample.stream(session, t, max_tokens)

        await asyncio.gather(*(arrival(o) for o in offsets))
        sample.wall = time.perf_counter() - start
    return sample
