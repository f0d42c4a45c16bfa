"""Mixed multi-model traffic, replayed: a seeded Poisson trace over two (or more) models, sent either to the
real ModelManager over stand-in engines (the switch scheduler's decision logic, on any machine) or to a real
gateway (a GPU with real engines), and summarised as goodput within a TTFT objective.

    trace = poisson_trace(rate=2.0, duration_s=120, mix={"a": 0.7, "b": 0.3}, seed=1)
    served = asyncio.run(replay_on_manager(manager, trace, service_s=3.0, prefill_s=0.15))
    summary(served, slo_ttft_s=10, duration_s=120)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from stack.config.sections.manager import ManagerConfig
from stack.manager.manager import ModelManager
from stack.manager.policy import Capacity
from stack.manager.slot import Slot
from stack.manager.unavailable import ModelUnavailable

from .standin_engine import StandInEngine

GIB = 1024**3


@dataclass(frozen=True)
class Arrival:
    at: float  # seconds from the trace's start
    model: str


def poisson_trace(rate: float, duration_s: float, mix: dict[str, float], seed: int = 1) -> list[Arrival]:
    """Arrivals at `rate` per second (exponential gaps), each for a model drawn from `mix` (weights)."""
    rng = random.Random(seed)
    names, weights = list(mix), list(mix.values())
    out, t = [], rng.expovariate(rate)
    while t < duration_s:
        out.append(Arrival(round(t, 4), rng.choices(names, weights)[0]))
        t += rng.expovariate(rate)
    return out


@dataclass
class Served:
    model: str
    at: float  # its arrival, seconds from the start
    ttft_s: float | None  # None: not served (refused, timed out, failed)
    e2e_s: float | None = None
    error: str = ""


def standin_manager(models: list[str], settings: ManagerConfig, switch_s: float) -> ModelManager:
    """The real ModelManager over stand-in engines (bench.harness.standin_engine) on a machine that holds one
    model at a time: every switch stops one and starts the other in `switch_s`."""
    slots = [Slot(m, StandInEngine(m, switch_s), need=GIB) for m in models]
    return ModelManager(slots, settings, Capacity(total=GIB, sleep_supported=False))


async def replay_on_manager(manager: ModelManager, trace: list[Arrival], service_s: float, prefill_s: float,
                            slots: int = 0) -> list[Served]:  # fmt: skip
    """Each arrival asks the manager for its model at its time; once admitted, its first token comes after
    `prefill_s` and its answer after `service_s`, then the ticket is released. `slots`: requests an engine
    runs at once (vLLM's max_num_seqs; more wait in it for a slot), 0: no limit (a batch that never fills)."""
    start = time.perf_counter()
    room = {m: asyncio.Semaphore(slots) for m in manager.slots} if slots else {}

    async def one(arrival: Arrival) -> Served:
        await asyncio.sleep(max(0.0, arrival.at - (time.perf_counter() - start)))
        sent = time.perf_counter()
        try:
            ticket = await manager.admit(arrival.model)
        except ModelUnavailable as exc:
            return Served(arrival.model, arrival.at, None, error=exc.message)
        try:
            async with room.get(arrival.model) or contextlib.nullcontext():
                await asyncio.sleep(prefill_s)
                ttft = time.perf_counter() - sent
                await asyncio.sleep(max(0.0, service_s - prefill_s))
            return Served(arrival.model, arrival.at, ttft, time.perf_counter() - sent)
        finally:
            if ticket is not None:
                ticket.release()

    try:
        return list(await asyncio.gather(*(one(a) for a in trace)))
    finally:
        await manager.shutdown()


async def replay_on_gateway(url: str, trace: list[Arrival], models: dict[str, str], *, max_tokens: int = 128,
                            prompt: str = "Write a short story about a lighthouse keeper.", api_key: str = "",
                            timeout_s: float = 300) -> list[Served]:  # fmt: skip
    """The trace against a running gateway: streamed chat completions, TTFT at the first content chunk.
    `models`: trace name -> the model name the gateway serves."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    start = time.perf_counter()
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s, limits=limits) as client:

        async def one(arrival: Arrival) -> Served:
            await asyncio.sleep(max(0.0, arrival.at - (time.perf_counter() - start)))
            body = {"model": models[arrival.model], "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "temperature": 0}  # fmt: skip
            sent, ttft = time.perf_counter(), None
            try:
                async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
                    if resp.status_code != 200:
                        return Served(arrival.model, arrival.at, None, error=f"HTTP {resp.status_code}")
                    async for line in resp.aiter_lines():
                        if ttft is None and line.startswith("data:") and '"content"' in line:
                            ttft = time.perf_counter() - sent
            except httpx.HTTPError as exc:
                return Served(arrival.model, arrival.at, None, error=type(exc).__name__)
            return Served(arrival.model, arrival.at, ttft, time.perf_counter() - sent)

        return list(await asyncio.gather(*(one(a) for a in trace)))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summary(served: list[Served], slo_ttft_s: float, duration_s: float) -> dict[str, Any]:
    """Goodput: requests answered with TTFT within the objective, per second of the trace; attainment: their
    share of all requests; per model: its count, attainment, p50/p95/max TTFT."""
    good = [s for s in served if s.ttft_s is not None and s.ttft_s <= slo_ttft_s]
    out: dict[str, Any] = {
        "requests": len(served), "within_slo": len(good), "goodput_rps": round(len(good) / duration_s, 4),
        "attainment": round(len(good) / len(served), 4) if served else None,
        "failed": sum(s.ttft_s is None for s in served), "models": {},
        # why each failed one did: the HTTP status, the client's exception, or a stream with no token at all
        "failures": dict(Counter(s.error or "no token in the stream" for s in served if s.ttft_s is None)),
    }  # fmt: skip
    for model in sorted({s.model for s in served}):
        mine = [s for s in served if s.model == model]
        ttfts = [s.ttft_s for s in mine if s.ttft_s is not None]
        within = sum(t <= slo_ttft_s for t in ttfts)
        out["models"][model] = {
            "requests": len(mine), "attainment": round(within / len(mine), 4),
            "p50_ttft_s": _r(percentile(ttfts, 0.5)), "p95_ttft_s": _r(percentile(ttfts, 0.95)),
            "max_ttft_s": _r(max(ttfts, default=None)),
        }  # fmt: skip
    return out


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def dump(served: list[Served]) -> str:
    return "\n".join(json.dumps(asdict(s)) for s in served) + "\n"
