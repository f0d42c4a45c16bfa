"""Streams held at a steady count by several client processes, counted over one window (bench/gateway_relay.py).

One Python process reads a few tens of thousands of SSE chunks a second at most, so a client that must take
>= 60k streamed tokens/s is several processes: each runs its share of `slots` (a slot starts its next streamed
chat completion as soon as its last one ends) on its own event loop. The slots' first streams are staggered
over one stream's length, so streams start and end evenly, not in waves; once every slot runs, a window of
`seconds` is counted: the content chunks (one token each) that arrive inside it, wherever their streams
started, and the TTFT and length of the streams that start inside it. The parent samples every party's CPU at
the window's edges (`run_round`'s `sample`), so tokens and CPU seconds are of the same interval.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import psutil

MARK = b'"content":'  # one per content chunk: the stand-in streams one token per chunk, as vLLM does
USAGE = re.compile(rb'"completion_tokens":\s*(\d+)')


@dataclass(frozen=True)
class Plan:
    """One round's schedule, the same in every client process (time.monotonic() is one clock for all)."""

    url: str  # base, without /v1
    slots: int  # streams in flight
    chunks: int  # tokens per stream
    stream_s: float  # a stream's length when nothing lags: chunks x the stand-in's cadence
    start: float  # when the first slot starts
    window: tuple[float, float]  # counted: [from, to); slots start no stream after `to`

    @classmethod
    def at(cls, url: str, slots: int, chunks: int, cadence_s: float, seconds: float, lead_s: float = 0.5) -> Plan:
        """Starting `lead_s` from now; the window opens when the last slot's first stream has begun."""
        start = time.monotonic() + lead_s
        opens = start + chunks * cadence_s + 0.25
        return cls(url, slots, chunks, chunks * cadence_s, start, (opens, opens + seconds))


@dataclass
class Share:
    """What one client process saw in a round."""

    window_tokens: int = 0  # content chunks that arrived inside the window
    ttft: list[float] = field(default_factory=list)  # of the streams that started inside it, seconds
    e2e: list[float] = field(default_factory=list)
    streams: int = 0  # every stream that ended, in or out of the window
    errors: int = 0  # streams that failed (HTTP status, connection, timeout)
    short: int = 0  # streams whose relayed chunks differ from the usage's completion_tokens (or had none)
    first_error: str = ""


async def _stream(session: aiohttp.ClientSession, plan: Plan, share: Share) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Say something."}], "stream": True,
            "max_tokens": plan.chunks, "stream_options": {"include_usage": True}}  # fmt: skip
    lo, hi = plan.window
    start = time.monotonic()
    first, tokens, carry, tail = 0.0, 0, b"", b""
    try:
        async with session.post(f"{plan.url}/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
            async for data in resp.content.iter_any():
                buf = carry + data  # a mark split between two reads is counted once, in the second
                found = buf.count(MARK)
                if found:
                    now = time.monotonic()
                    first = first or now - start
                    tokens += found
                    if lo <= now < hi:
                        share.window_tokens += found
                carry, tail = buf[1 - len(MARK) :], (tail + data)[-512:]
    except (aiohttp.ClientError, RuntimeError, TimeoutError) as exc:
        share.errors += 1
        share.first_error = share.first_error or f"{type(exc).__name__}: {exc}"[:300]
        await asyncio.sleep(0.1)  # a refused connection does not spin the slot
        return
    share.streams += 1
    usage = USAGE.findall(tail)
    if not usage or int(usage[-1]) != tokens:
        share.short += 1
    if lo <= start < hi:
        share.ttft.append(first)
        share.e2e.append(time.monotonic() - start)


async def _share(plan: Plan, index: int, processes: int) -> Share:
    share = Share()
    connector = aiohttp.TCPConnector(limit=0)  # kept alive, as vllm bench serve's client does
    timeout = aiohttp.ClientTimeout(total=plan.stream_s * 10 + 60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def slot(at: float) -> None:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            while time.monotonic() < plan.window[1]:
                await _stream(session, plan, share)

        # Slot i of all starts at i/slots of a stream's length: process `index` takes every `processes`-th one.
        await asyncio.gather(*(slot(plan.start + plan.stream_s * i / plan.slots)
                               for i in range(index, plan.slots, processes)))  # fmt: skip
    return share


def _client(plan: Plan, index: int, processes: int, out: mp.Queue) -> None:
    try:
        import uvloop  # as vLLM's and the gateway's own loops: the client costs fewer cores

        run = uvloop.run
    except (ImportError, AttributeError):  # no uvloop, or one older than 0.18
        run = asyncio.run
    out.put(run(_share(plan, index, processes)))


def cpu_of(pid: int, children: bool = True) -> float:
    """User + system CPU seconds of a process and its children (a gateway's owner and workers; children=False:
    the process alone, a gateway's owner without its workers); 0 once gone."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *(proc.children(recursive=True) if children else [])]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def machine_busy() -> float:
    """CPU seconds every core of the machine has spent on anything but idling, since boot."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def run_round(plan: Plan, processes: int, sample: Callable[[list[int]], dict[str, float]]) -> tuple[
        list[Share], dict[str, float]]:  # fmt: skip
    """`processes` clients (forked: nothing to import again) through `plan`; their shares and what `sample`
    (given the clients' pids) counted between the window's edges: {party: CPU seconds}."""
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_client, args=(plan, i, processes, out), daemon=True) for i in range(processes)]
    for p in procs:
        p.start()
    pids = [p.pid for p in procs if p.pid is not None]
    time.sleep(max(0.0, plan.window[0] - time.monotonic()))
    before = sample(pids)
    time.sleep(max(0.0, plan.window[1] - time.monotonic()))
    after = sample(pids)
    deadline = plan.window[1] + plan.stream_s * 10 + 90  # the streams in flight end; then a stuck client fails
    shares = []
    try:
        for _ in procs:
            shares.append(out.get(timeout=max(1.0, deadline - time.monotonic())))
    except queue.Empty:
        raise RuntimeError(f"bench.harness.relay_clients: {len(procs) - len(shares)} of {len(procs)} client "
                           f"processes sent no result by the round's deadline; their streams hang "
                           f"(is {plan.url} still answering?)") from None  # fmt: skip
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    return shares, {k: after[k] - before[k] for k in before}
