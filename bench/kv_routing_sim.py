"""The gateway's replica choice on a model of two engines' prefix caches (issue 55; adr/0050 amended).

    python bench/kv_routing_sim.py [--rates "8 16 24 32"] [--seeds 3] [--no-record]

What is real: the gateway's own chooser (stack.gateway.routing.replicas.ReplicaChooser) and KV index
(kv_index.KvIndex), fed with BlockStored/BlockRemoved as vLLM's engines send them (our block keys stand in for
vLLM's hashes: the index maps any hash to its own key). What is modelled: each engine, as a FCFS prefill queue
computing the prompt tokens its cache lacks at `--prefill-tok-s` plus `--overhead-ms`, an LRU cache of
`--blocks` blocks of 16 tokens (the blocks of running requests pinned, as vLLM's are), new blocks stored at
the end of their prefill and seen by the gateway `--event-lag-ms` later, decoding for `--decode-s`. The prefill
speed (50k tokens/s) and overhead (10 ms) are calibrated on that run's first seed at 24/s: TTFT p90 358 / 253 /
407 ms for kv_events-before / prefix_affinity / round robin, against the H200's 354 / 195 / 445 ms, and hit
rates 0.83 / 0.86 / 0.60 against 0.77 / 0.86 / 0.57.

The workload is the H200 x2 run's (bench/results/2026-11-29-h200-x2-kv-routing: 64 prefixes of 4,096 tokens,
suffixes of 256, Poisson arrivals for 30 s, 13,109 blocks per replica). Its purpose: the strategies side by
side with the choice as it was in that run (`kv_events-before`: weight 1, a request's tokens queued until its
end, no expected blocks) and as mended, so that what the mends change is known before the next GPU run. The
engines' hit rate is the figure to check against the GPU run; the TTFTs depend on the model's prefill speed.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import statistics
import sys
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stack.gateway.registry import Deployment
from stack.gateway.routing.kv_index import KvIndex, prompt_keys
from stack.gateway.routing.replicas import ReplicaChooser

BS = 16
# name -> (routing, load weight, expected blocks, a request leaves the prefill queue at its first token,
# gateway.kv_events_balance_threshold)
STRATEGIES = {
    "kv_events": ("kv_events", 0.5, True, True, 32),
    "kv_events-unbalanced": ("kv_events", 0.5, True, True, None),
    "kv_events@1": ("kv_events", 1.0, True, True, 32),
    "kv_events-before": ("kv_events", 1.0, False, False, None),
    "prefix_affinity": ("prefix_affinity", 0.5, False, True, None),
    "round_robin": ("round_robin", 0.5, False, True, None),
}


@dataclass
class Request:
    arrival: float
    tokens: list[int]
    keys: list[int]
    body: dict
    dep: str = ""
    queued: bool = False
    hit_tokens: int = 0
    pinned: list[int] = field(default_factory=list)
    ttft: float = 0.0


@dataclass
class Engine:
    id: str
    capacity: int
    cache: OrderedDict[int, int] = field(default_factory=OrderedDict)  # key -> parent key (0: none); LRU last
    pinned: Counter[int] = field(default_factory=Counter)
    waiting: deque[Request] = field(default_factory=deque)
    busy: bool = False


class Sim:
    def __init__(self, strategy: str, args: argparse.Namespace) -> None:
        routing, weight, expect, at_first_token, balance = STRATEGIES[strategy]
        self.args, self.at_first_token = args, at_first_token
        self.book = ReplicaChooser(routing, load_weight=weight, balance_threshold=balance)
        self.book.kv.index = KvIndex(expect_s=5.0 if expect else 0.0, clock=lambda: self.now)
        self.book.kv.live = lambda _dep: True  # type: ignore[method-assign]  # both engines' events are live
        self.deps = [Deployment(id=f"r{i}", model_group="m", kind="local", upstream_model="m", state="ready",
                                labels={"replica": str(i)}) for i in range(2)]  # fmt: skip
        self.engines = {d.id: Engine(d.id, args.blocks) for d in self.deps}
        for e in self.engines.values():  # the index knows each replica (and its block size) from its first event
            self.book.kv.index.stored(e.id, [], None, [], BS)
        self.now = 0.0
        self.queue: list[tuple[float, int, str, object]] = []
        self.seq = itertools.count()
        self.done: list[Request] = []

    def at(self, when: float, kind: str, what: object) -> None:
        heapq.heappush(self.queue, (when, next(self.seq), kind, what))

    def run(self, requests: list[Request]) -> list[Request]:
        for r in requests:
            self.at(r.arrival, "arrive", r)
        while self.queue:
            self.now, _, kind, what = heapq.heappop(self.queue)
            getattr(self, kind)(what)
        return self.done

    # -- the gateway -------------------------------------------------------------------------------------------
    def arrive(self, r: Request) -> None:
        r.dep = self.book.choose(self.deps, r.body, r.tokens).id
        r.queued = self.book.begin(r.dep)
        e = self.engines[r.dep]
        e.waiting.append(r)
        if not e.busy:
            self.start(e)

    def events(self, what: tuple[str, str, list[int], int | None, list[int]]) -> None:
        kind, engine, keys, parent, tokens = what  # our keys stand in for vLLM's block hashes
        if kind == "stored":
            self.book.kv.index.stored(engine, keys, parent, tokens, BS)
        else:
            self.book.kv.index.removed(engine, keys)

    # -- an engine ---------------------------------------------------------------------------------------------
    def start(self, e: Engine) -> None:
        r = e.waiting.popleft()
        e.busy = True
        hit = 0
        for key in r.keys:
            if key not in e.cache:
                break
            e.cache.move_to_end(key)
            hit += 1
        r.hit_tokens = hit * BS
        r.pinned = r.keys
        for key in r.keys:
            e.pinned[key] += 1
        evicted = []
        while len(e.cache) + len(r.keys) - hit > e.capacity:
            victim = next((k for k in e.cache if not e.pinned[k]), None)
            if victim is None:
                break
            del e.cache[victim]
            evicted.append(victim)
        if evicted:
            self.at(self.now + self.args.event_lag_ms / 1000, "events", ("removed", e.id, evicted, None, []))
        seconds = self.args.overhead_ms / 1000 + (len(r.tokens) - r.hit_tokens) / self.args.prefill_tok_s
        self.at(self.now + seconds, "prefilled", r)

    def prefilled(self, r: Request) -> None:
        e = self.engines[r.dep]
        hit = r.hit_tokens // BS
        new = r.keys[hit:]
        for i, key in enumerate(new):
            e.cache[key] = r.keys[hit + i - 1] if hit + i else 0
        if new:
            parent = r.keys[hit - 1] if hit else None
            tokens = r.tokens[hit * BS : len(r.keys) * BS]
            self.at(self.now + self.args.event_lag_ms / 1000, "events", ("stored", e.id, list(new), parent, tokens))
        r.ttft = self.now - r.arrival
        if self.at_first_token and r.queued:
            r.queued = False
            self.book.prefilled(r.dep)
        self.at(self.now + self.args.decode_s, "end", r)
        e.busy = False
        if e.waiting:
            self.start(e)

    def end(self, r: Request) -> None:
        e = self.engines[r.dep]
        for key in r.pinned:
            e.pinned[key] -= 1
        self.book.end(r.dep, r.queued)
        self.done.append(r)


def workload(rate: float, seconds: float, prefixes: int, prefix_len: int, suffix_len: int, seed: int,
             hot_share: float = 0.0) -> list[Request]:  # fmt: skip
    """vLLM bench's prefix_repetition: each request a random prefix of `prefixes` and a suffix of its own; with
    `hot_share`, that share of the requests has one more prefix of its own (one app's system prompt beside the
    sessions of many: bench/gpu/kv_routing.sh's HOT_SHARE runs it as a second client)."""
    rng = random.Random(seed)
    heads = [[rng.randrange(1, 1 << 30) for _ in range(prefix_len)] for _ in range(prefixes + 1)]
    out, t = [], 0.0
    while (t := t + rng.expovariate(rate)) < seconds:
        p = prefixes if hot_share and rng.random() < hot_share else rng.randrange(prefixes)
        tokens = heads[p] + [rng.randrange(1, 1 << 30) for _ in range(suffix_len)]
        body = {"prompt": " ".join(f"t{x}" for x in heads[p][:128]) + f" q{t}"}  # affinity reads its first chars
        out.append(Request(t, tokens, prompt_keys(tokens, BS), body))
    return out


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="8 16 24 32")
    ap.add_argument("--strategies", default=" ".join(STRATEGIES))
    ap.add_argument("--seeds", type=int, default=3, help="workloads per (rate, strategy); figures pooled")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--prefixes", type=int, default=64)
    ap.add_argument("--hot-share", type=float, default=0.0, help="share of requests on one more, hot prefix")
    ap.add_argument("--prefix-len", type=int, default=4096)
    ap.add_argument("--suffix-len", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=13_109, help="per replica (the H200 run's index held 13,109)")
    ap.add_argument("--prefill-tok-s", type=float, default=50_000, help="calibrated: the H200 run's TTFT p90 at 24/s")
    ap.add_argument("--overhead-ms", type=float, default=10)
    ap.add_argument("--decode-s", type=float, default=1.0)
    ap.add_argument("--event-lag-ms", type=float, default=5)
    ap.add_argument("--no-record", action="store_true", help="print only; no bench/results folder")
    args = ap.parse_args()
    rows = []
    for rate in [float(x) for x in args.rates.split()]:
        for strategy in args.strategies.split():
            done: list[Request] = []
            for seed in range(args.seeds):
                reqs = workload(rate, args.seconds, args.prefixes, args.prefix_len, args.suffix_len, seed,
                                args.hot_share)
                done += Sim(strategy, args).run(reqs)
            ttft = [r.ttft * 1000 for r in done]
            hit = sum(r.hit_tokens for r in done) / sum(len(r.tokens) for r in done)
            rows.append({"rate": rate, "strategy": strategy, "requests": len(done), "hit_rate": round(hit, 3),
                         "ttft_mean_ms": round(statistics.fmean(ttft), 1),
                         "ttft_p50_ms": round(pct(ttft, 50), 1), "ttft_p90_ms": round(pct(ttft, 90), 1),
                         "ttft_p99_ms": round(pct(ttft, 99), 1)})  # fmt: skip
            print(rows[-1], flush=True)
    print(table(rows))
    if not args.no_record:
        record(rows, args)
    return 0


def table(rows: list[dict]) -> str:
    lines = [f"{'rate':>5} {'strategy':<18} {'hit rate':>8} {'mean ms':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}"]
    lines += [f"{r['rate']:>5g} {r['strategy']:<18} {r['hit_rate']:>8} {r['ttft_mean_ms']:>8} {r['ttft_p50_ms']:>8} "
              f"{r['ttft_p90_ms']:>8} {r['ttft_p99_ms']:>8}" for r in rows]  # fmt: skip
    return "\n".join(lines)


def record(rows: list[dict], args: argparse.Namespace) -> None:
    from bench.harness.manifest import Figure
    from bench.harness.results import record as write

    def cell(rate: float, strategy: str) -> dict:
        return next(r for r in rows if r["rate"] == rate and r["strategy"] == strategy)

    figures = []
    for rate in dict.fromkeys(r["rate"] for r in rows):
        names = {r["strategy"] for r in rows if r["rate"] == rate}
        if {"kv_events", "kv_events-before", "prefix_affinity", "round_robin"} <= names:
            new, old = cell(rate, "kv_events"), cell(rate, "kv_events-before")
            hash_, rr = cell(rate, "prefix_affinity"), cell(rate, "round_robin")
            figures += [
                Figure(name=f"rate {rate:g}/s: TTFT p90, round robin / kv_events (mended)",
                       value=round(rr["ttft_p90_ms"] / new["ttft_p90_ms"], 2), unit="x",
                       meaning=f"{rr['ttft_p90_ms']} vs {new['ttft_p90_ms']} ms; hit rate {rr['hit_rate']} vs "
                       f"{new['hit_rate']}"),
                Figure(name=f"rate {rate:g}/s: TTFT p90, prefix_affinity / kv_events (mended)",
                       value=round(hash_["ttft_p90_ms"] / new["ttft_p90_ms"], 2), unit="x",
                       meaning=f"{hash_['ttft_p90_ms']} vs {new['ttft_p90_ms']} ms; hit rate {hash_['hit_rate']}"),
                Figure(name=f"rate {rate:g}/s: TTFT p90, kv_events as in the H200 run / mended",
                       value=round(old["ttft_p90_ms"] / new["ttft_p90_ms"], 2), unit="x",
                       meaning=f"{old['ttft_p90_ms']} vs {new['ttft_p90_ms']} ms; hit rate {old['hit_rate']} vs "
                       f"{new['hit_rate']}"),
                Figure(name=f"rate {rate:g}/s: TTFT mean, kv_events as in the H200 run / mended",
                       value=round(old["ttft_mean_ms"] / new["ttft_mean_ms"], 2), unit="x",
                       meaning=f"{old['ttft_mean_ms']} vs {new['ttft_mean_ms']} ms (prefix_affinity "
                       f"{hash_['ttft_mean_ms']}, round robin {rr['ttft_mean_ms']})"),
            ]  # fmt: skip
        if {"kv_events", "kv_events-unbalanced", "prefix_affinity"} <= names:
            new, off, hash_ = cell(rate, "kv_events"), cell(rate, "kv_events-unbalanced"), cell(rate, "prefix_affinity")
            figures.append(Figure(
                name=f"{args.prefixes} prefixes, {rate:g}/s: TTFT p90, kv_events without its balance rule / with it",
                value=round(off["ttft_p90_ms"] / new["ttft_p90_ms"], 2), unit="x",
                meaning=f"{off['ttft_p90_ms']} vs {new['ttft_p90_ms']} ms (prefix_affinity {hash_['ttft_p90_ms']}); "
                f"p99 {off['ttft_p99_ms']} vs {new['ttft_p99_ms']} ms"))  # fmt: skip
        if {"kv_events", "prefix_affinity", "round_robin"} <= names and args.hot_share:
            new, hash_, rr = cell(rate, "kv_events"), cell(rate, "prefix_affinity"), cell(rate, "round_robin")
            mix = f"mixed ({args.hot_share:g} on one hot prefix), {rate:g}/s"
            figures += [Figure(name=f"{mix}: TTFT p90, {b} / kv_events",
                               value=round(other["ttft_p90_ms"] / new["ttft_p90_ms"], 2), unit="x",
                               meaning=f"{other['ttft_p90_ms']} vs {new['ttft_p90_ms']} ms; hit rate "
                               f"{other['hit_rate']} vs {new['hit_rate']}")
                        for b, other in (("prefix_affinity", hash_), ("round robin", rr))]  # fmt: skip
    workload = "the H200 x2 run's workload" if args.prefixes == 64 else f"{args.prefixes} shared prefix(es)"
    if args.hot_share:
        workload += f", with {args.hot_share:g} of the requests on one more, hot prefix"
    folder = write("kv-routing-sim", f"The gateway's replica choice (its own code) on a model of two engines' "
                   f"prefix caches, {workload}: TTFT p50/p90/p99 and the engines' hit rate per strategy and rate "
                   "(the choice as in the first H200 run, mended, and without the balance rule)", figures,
                   raw={"args": vars(args), "rows": rows})  # fmt: skip
    print(f"wrote {folder}")


if __name__ == "__main__":
    raise SystemExit(main())
