"""A quiet tenant beside a noisy one at 10x the engine's capacity: its p95 TTFT and goodput with today's FIFO,
with vLLM's priority scheduling alone, and with the gateway's fair admission; and how exactly a tpm limit holds
(issue 52, item 4; adr/0043).

    python bench/tenant_fairness.py                      # 2.5 minutes on 2 CPU cores
    python bench/tenant_fairness.py --phase-s 30 --out /tmp/x.json
    python bench/tenant_fairness.py --engine-url URL --noisy-rps R --tokens 256 --slots 32 --no-limit --out F
                                    a real engine instead of the stand-in (bench/gpu/tenant_fairness.sh: an 8B
                                    shape on a lent GPU, vLLM's --scheduling-policy priority)

The engine is the paced stand-in (bench/harness/paced_engine.py, a child process): `--slots` sequences at
once, `--tokens` tokens each `--token-ms` apart, the rest in its own queue (first come first served, or by
priority). Its capacity is slots / (tokens x token_ms) requests/s. Each phase is a fresh engine and a fresh
gateway (in this process), each tenant a named key:
- alone: the quiet tenant only (its reference);
- fifo: both, admission off (today): every request goes to the engine's queue;
- vllm-priority: both, admission off, the engine ordering its queue by priority and the quiet key in the high
  class (vLLM's --scheduling-policy priority, the class handed over by the gateway);
- fair: both, admission on (max_in_engine = slots), same class: weighted fair queueing between them;
- fair-reserve: the same with `reserve: 1` (a place kept for a tenant with nothing in the engine).
The quiet tenant streams one request every 1/--quiet-rps s (a steady rate); the noisy one opens requests at
10x the capacity, open loop, with at most --noisy-outstanding in flight (its client's connection pool).
Goodput: the quiet tenant's requests answered with TTFT within --slo-ms, per second of the phase.

Limit exactness runs beside the phases in a process of its own (gateway, second stand-in, client): a tenant
with a tpm limit whose client retries when the 429's retry-after-ms says; the tokens admitted (from the
answers' usage, by the time each was sent) in every 60 s window after the first minute, against the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness.children import Children  # noqa: E402
from bench.harness.gateway_thread import app_in_thread  # noqa: E402
from bench.harness.manifest import Figure  # noqa: E402
from bench.harness.results import record  # noqa: E402
from bench.harness.tenant_load import KEYS, METERED, Metered, body, gateway_app, sha, start_engine  # noqa: E402
from bench.harness.trace_replay import percentile  # noqa: E402

PHASES = ("alone", "fifo", "vllm-priority", "fair", "fair-reserve")


async def one(session: aiohttp.ClientSession, url: str, key: str, data: bytes, out: list[dict], who: str) -> None:
    t0 = time.perf_counter()
    rec: dict = {"who": who, "sent": t0, "status": 0, "ttft_s": None, "done_s": None}
    try:
        async with session.post(
            f"{url}/v1/chat/completions",
            data=data,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        ) as r:
            rec["status"] = r.status
            if r.status == 200:
                async for _chunk in r.content.iter_any():
                    if rec["ttft_s"] is None:
                        rec["ttft_s"] = time.perf_counter() - t0
                rec["done_s"] = time.perf_counter() - t0
            else:
                await r.read()
    except (aiohttp.ClientError, TimeoutError):
        rec["status"] = -1
    except asyncio.CancelledError:
        rec["status"] = -2  # still waiting when the phase ended
        out.append(rec)
        raise
    out.append(rec)


async def phase_load(url: str, seconds: float, quiet_rps: float, noisy_rps: float, tokens: int,
                     outstanding: int, service_s: float) -> list[dict]:  # fmt: skip
    out: list[dict] = []
    tasks: set[asyncio.Task] = set()
    noisy_open = [0]
    skipped = [0]
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:

        async def quiet() -> None:
            i, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                t = asyncio.create_task(one(session, url, KEYS["quiet"], body(f"q{i}", tokens), out, "quiet"))
                tasks.add(t)
                i += 1
                await asyncio.sleep(max(0.0, start + i / quiet_rps - time.perf_counter()))

        async def noisy_one(i: int) -> None:
            noisy_open[0] += 1
            try:
                await one(session, url, KEYS["noisy"], body(f"n{i}", tokens), out, "noisy")
            finally:
                noisy_open[0] -= 1

        async def noisy() -> None:
            i, start = 0, time.perf_counter()
            while noisy_rps and time.perf_counter() - start < seconds:
                if noisy_open[0] < outstanding:
                    tasks.add(asyncio.create_task(noisy_one(i)))
                else:
                    skipped[0] += 1
                i += 1
                await asyncio.sleep(max(0.0, start + i / noisy_rps - time.perf_counter()))

        await asyncio.gather(quiet(), noisy())
        # the quiet tenant's last requests get the time to answer; then whatever still waits is cut
        pending = [t for t in tasks if not t.done()]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), service_s + 2)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    out.append({"who": "noisy-skipped", "count": skipped[0]})
    return out


def summarize(rows: list[dict], seconds: float, slo_s: float) -> dict:
    quiet = [r for r in rows if r.get("who") == "quiet"]
    noisy = [r for r in rows if r.get("who") == "noisy"]
    ttfts = [r["ttft_s"] for r in quiet if r["ttft_s"] is not None]
    good = [r for r in quiet if r["status"] == 200 and r["ttft_s"] is not None and r["ttft_s"] <= slo_s]
    unanswered = [r for r in quiet if r["ttft_s"] is None]
    skipped = next((r["count"] for r in rows if r.get("who") == "noisy-skipped"), 0)
    noisy_ok = [r for r in noisy if r["status"] == 200]
    return {
        "quiet_sent": len(quiet), "quiet_p50_ttft_ms": _ms(percentile(ttfts, 0.5)),
        "quiet_p95_ttft_ms": _ms(percentile(ttfts, 0.95)) if not unanswered else None,
        "quiet_unanswered": len(unanswered), "quiet_goodput_rps": round(len(good) / seconds, 3),
        "quiet_goodput_share": round(len(good) / max(1, len(quiet)), 3),
        "noisy_sent": len(noisy), "noisy_answered": len(noisy_ok), "noisy_429": sum(r["status"] == 429 for r in noisy),
        "noisy_skipped_by_client": skipped,
    }  # fmt: skip


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 1)


class Meter(Metered):
    """The tpm tenant (bench.harness.tenant_load.Metered) and its windows after the first minute."""

    def windows(self, limit: int) -> dict:
        """Tokens admitted in each 60 s window starting 60 s after the first request, 1 s apart."""
        if not self.admitted:
            return {"windows": 0}
        end = self.t1
        sums = []
        start = self.t0 + 60
        while start + 60 <= end:
            sums.append(sum(n for t, n in self.admitted if start <= t < start + 60 and t < end))
            start += 1
        if not sums:
            return {"windows": 0}
        return {
            "windows": len(sums),
            "limit_tpm": limit,
            "min_tokens": min(sums),
            "max_tokens": max(sums),
            "mean_tokens": round(statistics.mean(sums), 1),
            "min_ratio": round(min(sums) / limit, 4),
            "max_ratio": round(max(sums) / limit, 4),
            "admitted": len(self.admitted),
            "refused": self.refused,
        }


def limit_run(tpm: int, seconds: float) -> dict:
    """The tpm tenant's whole run: its stand-in, its gateway, its client; the windows' figures."""
    with Children() as children:
        _, engine = start_engine(children, "metered-engine", 4, 2)
        tenants = [{"name": "metered", "sha256": sha(KEYS["metered"]), "limits": {"tpm": tpm}}]
        with app_in_thread(gateway_app("fifo", engine, 4, METERED, tenants)) as (url, _):
            metered = Meter(url, 16, "m" * 96)  # 24 prompt tokens + 16 out: 40 a request
            metered.thread.start()
            time.sleep(seconds)
            metered.t1 = time.time()  # the windows end here (a request sent later is not counted)
            metered.stop.set()
            metered.thread.join(30)
    return metered.windows(tpm)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase-s", type=float, default=20)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--token-ms", type=float, default=25)
    ap.add_argument("--quiet-rps", type=float, default=1.0)
    ap.add_argument("--noisy-x", type=float, default=10, help="the noisy tenant's rate, in engine capacities")
    ap.add_argument("--noisy-outstanding", type=int, default=256)
    ap.add_argument("--slo-ms", type=float, default=500)
    ap.add_argument("--tpm", type=int, default=6000)
    ap.add_argument("--meter-s", type=float, default=150, help="the tpm tenant's run (windows from its 60th s)")
    ap.add_argument("--meter-only", action="store_true", help="the tpm tenant alone (the run starts it so)")
    ap.add_argument("--out", type=Path, default=None, help="a JSON file instead of bench/results/")
    ap.add_argument("--engine-url", default=None, help="a running engine serving model `shared` (started with "
                    "--scheduling-policy priority: a request without a priority is first come first served) "
                    "for every phase, instead of a stand-in per phase; --slots is its --max-num-seqs")
    ap.add_argument("--noisy-rps", type=float, default=None, help="the noisy rate (default: --noisy-x times the "
                    "stand-in's capacity, slots / (tokens x token-ms))")
    ap.add_argument("--no-limit", action="store_true", help="skip the tpm exactness run (bench/tenant_limits.py)")
    args = ap.parse_args()
    if args.meter_only:
        args.out.write_text(json.dumps(limit_run(args.tpm, args.meter_s)))
        return
    capacity = args.slots / (args.tokens * args.token_ms / 1000)
    noisy_rps = args.noisy_rps if args.noisy_rps is not None else args.noisy_x * capacity
    import os

    results: dict = {
        "load_average_at_start": os.getloadavg(),
        "capacity_rps": round(capacity, 2),
        "noisy_rps": round(noisy_rps, 1),
        "args": vars(args) | {"out": str(args.out)},
        "phases": {},
    }
    with Children() as children:
        meter = None
        meter_out = children.logs / "limit.json"
        if not args.no_limit:
            # The tpm tenant in a process of its own: no GIL shared with the flood, whose stalls would show as a
            # client late to retry, not as the limit's arithmetic.
            meter = children.start("limit", [sys.executable, "bench/tenant_fairness.py", "--meter-only", "--tpm",
                                             str(args.tpm), "--meter-s", str(args.meter_s), "--out", str(meter_out)])
        for phase in PHASES:
            policy = "priority" if phase == "vllm-priority" else "fcfs"
            child, engine = (None, args.engine_url) if args.engine_url else \
                start_engine(children, f"engine-{phase}", args.slots, args.token_ms, policy)  # fmt: skip
            with app_in_thread(gateway_app(phase, engine, args.slots), graceful_s=0.5) as (url, _):
                noisy = 0 if phase == "alone" else noisy_rps
                service_s = args.tokens * args.token_ms / 1000
                rows = asyncio.run(phase_load(url, args.phase_s, args.quiet_rps, noisy, args.tokens,
                                              args.noisy_outstanding, service_s))  # fmt: skip
            if child is not None:
                children.stop(child)
            else:
                drain(engine)  # the next phase starts on an empty engine
            results["phases"][phase] = summarize(rows, args.phase_s, args.slo_ms / 1000)
            print(phase, json.dumps(results["phases"][phase]), flush=True)
        if meter is not None:
            meter.popen.wait(args.meter_s + 60)
            results["limit_exactness"] = json.loads(meter_out.read_text())
            print("limit", json.dumps(results["limit_exactness"]), flush=True)
    write(results, args)


def drain(engine: str, timeout: float = 300) -> None:
    """Wait until the engine runs and queues nothing (vLLM's own gauges), after a phase's cut requests."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(f"{engine}/metrics", timeout=10).text
        busy = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")))  # fmt: skip
        if busy == 0:
            return
        time.sleep(1)


def write(results: dict, args: argparse.Namespace) -> None:
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1))
        return
    ph, lim = results["phases"], results["limit_exactness"]
    alone = ph["alone"]
    figures = []
    for name in PHASES:
        p = ph[name]
        p95 = p["quiet_p95_ttft_ms"]
        figures.append(
            Figure(
                name=f"{name}: quiet p95 TTFT",
                value=p95 if p95 is not None else "unanswered",
                unit="ms" if p95 is not None else "",
                meaning=f"the quiet tenant's p95 time to first token ({name}); lower is "
                "better; 'unanswered' when some of its requests got no first token in the phase",
            )
        )
        if name != "alone" and p95 is not None and alone["quiet_p95_ttft_ms"]:
            figures.append(Figure(name=f"{name}: quiet p95 TTFT vs alone", unit="x",
                                  value=round(p95 / alone["quiet_p95_ttft_ms"], 2),
                                  meaning="the goal is within 1.2x of its value alone"))  # fmt: skip
        figures.append(Figure(name=f"{name}: quiet goodput vs alone", unit="x",
                              value=round(p["quiet_goodput_rps"] / max(alone["quiet_goodput_rps"], 1e-9), 3),
                              meaning=f"requests answered within TTFT {args.slo_ms:g} ms per second, against alone; "
                              "the goal is >= 0.95"))  # fmt: skip
    figures += [
        Figure(name="tpm limit: min admitted / limit", value=lim.get("min_ratio", 0), unit="x",
               meaning=f"the fewest tokens admitted in a 60 s window against tpm {args.tpm} (goal >= 0.98)"),
        Figure(name="tpm limit: max admitted / limit", value=lim.get("max_ratio", 0), unit="x",
               meaning="the most tokens admitted in a 60 s window against the limit (goal <= 1.0)"),
    ]  # fmt: skip

    def p95(name: str) -> str:
        p = ph[name]
        return f"{p['quiet_p95_ttft_ms']} ms" if p["quiet_p95_ttft_ms"] is not None else \
            f"unanswered ({p['quiet_unanswered']} of {p['quiet_sent']} got no first token)"  # fmt: skip

    summary = (f"quiet tenant beside a noisy one at {args.noisy_x:g}x capacity: p95 TTFT fifo {p95('fifo')}, "
               f"vllm-priority {p95('vllm-priority')}, fair {p95('fair')}, fair+reserve {p95('fair-reserve')} vs "
               f"{p95('alone')} alone; tpm windows {lim.get('min_ratio')}-{lim.get('max_ratio')}x "
               "the limit")  # fmt: skip
    folder = record("tenant-fairness", summary, figures, raw=results)
    print(f"results: {folder}")


if __name__ == "__main__":
    main()
