"""What 1,000 named keys cost a request: the gateway's added latency with 1,000 keys configured beside the same
gateway with a few, and with today's single client key, side by side in one run (issue 52's third goal; adr/0043).

    python bench/tenant_keys_latency.py                       # ~90 s on 2 CPU cores
    python bench/tenant_keys_latency.py --rounds 2 --requests 200 --out /tmp/x.json

Four targets, each its own process, in front of one stand-in upstream (bench/harness/mock_upstream.py, unpaced:
its answer costs nothing, so what shows is the proxy's own path):
- direct: the stand-in itself (the floor the others are read against);
- api-key: the gateway with one gateway.api_keys key (today's client key, before named keys);
- keys-3: the gateway with 3 named keys;
- keys-1000: the gateway with 1,000 named keys.
Every named key has the same limits (rpm, tpm: far above this load, so each request is checked against both
and none is refused). The client sends a small non-streamed chat request (max_tokens 4) one at a time, cycling
through 10 of the keys (spread over the whole set), in interleaved rounds so that the machine's drift hits all
targets alike. Added latency = a target's percentile minus direct's. It also times the key lookup itself
(TenantBook.identify, in this process) with 3 and with 1,000 keys.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
import timeit
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness.children import Children  # noqa: E402
from bench.harness.manifest import Figure  # noqa: E402
from bench.harness.results import record  # noqa: E402
from bench.harness.trace_replay import percentile  # noqa: E402
from bench.harness.waiting import free_port  # noqa: E402

PY = sys.executable
MODEL = "fast"
LIMITS = {"rpm": 10_000_000, "tpm": 1_000_000_000}
TARGETS = ("direct", "api-key", "keys-3", "keys-1000")


def key_of(i: int) -> str:
    return f"bench-named-key-{i:06d}-" + "x" * 24


def tenants(n: int) -> list[dict]:
    return [{"name": f"t{i:04d}", "sha256": hashlib.sha256(key_of(i).encode()).hexdigest(), "limits": LIMITS}
            for i in range(n)]  # fmt: skip


def used_keys(n: int) -> list[str]:
    """10 keys spread over the set (the first, the last and between): no one cache-friendly key."""
    return [key_of(min(n - 1, round(j * (n - 1) / 9))) for j in range(10)]


async def load(url: str, keys: list[str], n: int, model: str) -> list[float]:
    """n requests one after another (closed loop, c=1): each one's end-to-end seconds."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hello there"}],
                       "max_tokens": 4}).encode()  # fmt: skip
    out = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        for i in range(n):
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {keys[i % len(keys)]}"}
            t0 = time.perf_counter()
            async with session.post(f"{url}/v1/chat/completions", data=body, headers=headers) as r:
                await r.read()
                if r.status != 200:
                    raise SystemExit(f"{url} answered {r.status}: {await r.text()}")
            out.append(time.perf_counter() - t0)
    return out


def lookup_ns(n: int) -> float:
    """TenantBook.identify's ns per call (a SHA-256 and a dict lookup) with n keys, the best of 5."""
    from stack.config.sections.tenants import TenantConfig
    from stack.gateway.tenants.book import TenantBook

    book = TenantBook.from_config([TenantConfig.model_validate(t) for t in tenants(n)], {})
    keys = used_keys(n)
    assert all(book.identify(k) is not None for k in keys)
    calls = 20_000
    best = min(timeit.repeat(lambda: [book.identify(k) for k in keys], number=calls // len(keys), repeat=5))
    return best / calls * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds over the targets")
    ap.add_argument("--requests", type=int, default=2000, help="requests per target and round")
    ap.add_argument("--keys", type=int, default=1000, help="the many-keys gateway's named keys")
    ap.add_argument("--out", type=Path, default=None, help="a JSON file instead of bench/results/")
    args = ap.parse_args()
    results: dict = {"load_average_at_start": os.getloadavg(), "args": vars(args) | {"out": str(args.out)},
                     "lookup_ns": {"3": round(lookup_ns(3)), str(args.keys): round(lookup_ns(args.keys))}}  # fmt: skip
    print("lookup ns per request:", results["lookup_ns"], flush=True)
    with Children() as procs:
        up = free_port()
        mock = procs.start("mock", [PY, "bench/harness/mock_upstream.py", "--port", str(up), "--chunks", "4",
                                    "--name", MODEL])  # fmt: skip
        mock.wait_http(f"http://127.0.0.1:{up}/health", 30)
        ports, keys = {"direct": up}, {"direct": ["none"]}
        configs = {"api-key": {"api_keys": [{"name": "team", "sha256": hashlib.sha256(b"bench-api-key").hexdigest()}]},
                   "keys-3": {"tenants": tenants(3)}, "keys-1000": {"tenants": tenants(args.keys)}}  # fmt: skip
        keys |= {"api-key": ["bench-api-key"], "keys-3": used_keys(3), "keys-1000": used_keys(args.keys)}
        children = {}
        for name, gateway in configs.items():
            cfg = procs.logs / f"{name}.json"
            gateway |= {"liveness": {"enabled": False}, "spill": {"enabled": False}}
            # a state folder each (runtime.json, usage.json, the admin token): never the user's
            cfg.write_text(json.dumps({"gateway": gateway, "state_dir": str(procs.logs / f"state-{name}")}))
            ports[name] = free_port()
            children[name] = procs.start(f"gateway-{name}", [PY, "-m", "stack.entrypoints.gateway", "--port",
                                                             str(ports[name]), "--config", str(cfg), "--upstream",
                                                             f"{MODEL}=http://127.0.0.1:{up}@{MODEL}"])  # fmt: skip
        for name, child in children.items():
            child.wait_http(f"http://127.0.0.1:{ports[name]}/health", 120)
        samples: dict[str, list[float]] = {t: [] for t in TARGETS}
        rounds: dict[str, list[dict]] = {t: [] for t in TARGETS}  # each round's own p50/p99: the noise's size
        for t in TARGETS:  # warm-up: connections, first-call paths
            asyncio.run(load(f"http://127.0.0.1:{ports[t]}", keys[t], 50, MODEL))
        for r in range(args.rounds):
            for t in TARGETS if r % 2 == 0 else reversed(TARGETS):  # each target first and last in turn
                got = asyncio.run(load(f"http://127.0.0.1:{ports[t]}", keys[t], args.requests, MODEL))
                samples[t] += got
                rounds[t].append({"p50_ms": round(percentile(got, 0.5) * 1e3, 3),
                                  "p99_ms": round(percentile(got, 0.99) * 1e3, 3)})  # fmt: skip
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    rows = {}
    for t in TARGETS:
        p99s = [r["p99_ms"] for r in rounds[t]]
        rows[t] = {"n": len(samples[t]), "p50_ms": round(percentile(samples[t], 0.5) * 1e3, 3),
                   "p99_ms": round(percentile(samples[t], 0.99) * 1e3, 3), "rounds": rounds[t],
                   "p99_range_ms": [min(p99s), max(p99s)]}  # fmt: skip
    for t in TARGETS[1:]:
        rows[t]["added_p50_ms"] = round(rows[t]["p50_ms"] - rows["direct"]["p50_ms"], 3)
        rows[t]["added_p99_ms"] = round(rows[t]["p99_ms"] - rows["direct"]["p99_ms"], 3)
    many, few = rows["keys-1000"], rows["keys-3"]
    results["targets"] = rows
    results["ratio_1000_vs_3"] = {"p50": round(many["p50_ms"] / few["p50_ms"], 3),
                                  "p99": round(many["p99_ms"] / few["p99_ms"], 3)}  # fmt: skip
    # A paired sign test over the rounds (each round runs both gateways back to back): a real cost shows as the
    # many-keys gateway slower in (nearly) every round; noise, as about half
    results["rounds_1000_slower"] = {
        q: sum(b[q] > a[q] for a, b in zip(rounds["keys-3"], rounds["keys-1000"], strict=True))
        for q in ("p50_ms", "p99_ms")
    }
    results["load_average_at_end"] = os.getloadavg()
    print(f"{'target':<10} {'p50 ms':>8} {'p99 ms':>8} {'+p50':>7} {'+p99':>7}  p99 of each round (ms)")
    for t, row in rows.items():
        low, high = row["p99_range_ms"]
        print(f"{t:<10} {row['p50_ms']:>8.3f} {row['p99_ms']:>8.3f} {row.get('added_p50_ms', 0):>7.3f} "
              f"{row.get('added_p99_ms', 0):>7.3f}  {low:.2f}-{high:.2f}")  # fmt: skip
    slower = results["rounds_1000_slower"]
    print(f"1,000 keys vs 3: p50 {results['ratio_1000_vs_3']['p50']}x, p99 {results['ratio_1000_vs_3']['p99']}x; "
          f"slower in {slower['p50_ms']} (p50) and {slower['p99_ms']} (p99) of {args.rounds} rounds")  # fmt: skip
    write(results, args)


def write(results: dict, args: argparse.Namespace) -> None:
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1))
        return
    rows, ratio, lk = results["targets"], results["ratio_1000_vs_3"], results["lookup_ns"]
    n = args.keys
    figures = []
    for t in TARGETS[1:]:
        figures += [
            Figure(name=f"{t}: added p50", value=rows[t]["added_p50_ms"], unit="ms",
                   meaning=f"the gateway's p50 minus direct's, a small non-streamed request at c=1 ({t}); lower is "
                   "better"),
            Figure(name=f"{t}: added p99", value=rows[t]["added_p99_ms"], unit="ms",
                   meaning=f"the gateway's p99 minus direct's ({t}); lower is better"),
            Figure(name=f"{t}: p99 range over rounds", unit="ms",
                   value=f"{rows[t]['p99_range_ms'][0]:.2f}-{rows[t]['p99_range_ms'][1]:.2f}",
                   meaning="the lowest and highest p99 of one round: the noise a p99 difference reads against"),
        ]  # fmt: skip
    figures += [
        Figure(name=f"{n} keys vs 3: p50 ratio", value=ratio["p50"], unit="x",
               meaning=f"end-to-end p50 with {n} named keys over 3; the goal is within noise of 1"),
        Figure(name=f"{n} keys vs 3: p99 ratio", value=ratio["p99"], unit="x",
               meaning=f"end-to-end p99 with {n} named keys over 3; the goal is within noise of 1"),
        Figure(name=f"rounds with {n} keys slower (p50)", value=results["rounds_1000_slower"]["p50_ms"], unit="",
               meaning=f"of {args.rounds} rounds, those whose p50 with {n} keys was above 3 keys' (about half: "
               "noise; nearly all: a cost)"),
        Figure(name=f"rounds with {n} keys slower (p99)", value=results["rounds_1000_slower"]["p99_ms"], unit="",
               meaning=f"the same for each round's p99 (of {args.rounds})"),
        Figure(name="key lookup, 3 keys", value=lk["3"], unit="ns",
               meaning="TenantBook.identify per request (SHA-256 and a dict lookup)"),
        Figure(name=f"key lookup, {n} keys", value=lk[str(n)], unit="ns",
               meaning="the same with the many keys: O(1), the same as with 3"),
    ]  # fmt: skip
    summary = (f"a small request at c=1, added over direct: p50 {rows['keys-1000']['added_p50_ms']} ms with {n} "
               f"named keys, {rows['keys-3']['added_p50_ms']} ms with 3, {rows['api-key']['added_p50_ms']} ms with "
               f"one api key; {n} vs 3 keys end to end p50 {ratio['p50']}x, p99 {ratio['p99']}x; key lookup "
               f"{lk['3']} ns (3) vs {lk[str(n)]} ns ({n}); p99 of a round {rows['keys-3']['p99_range_ms']} ms "
               f"(3 keys), {rows['keys-1000']['p99_range_ms']} ms ({n}); {n} keys slower in "
               f"{results['rounds_1000_slower']['p50_ms']}/{args.rounds} rounds (p50), "
               f"{results['rounds_1000_slower']['p99_ms']}/{args.rounds} (p99)")  # fmt: skip
    folder = record("tenant-keys-latency", summary, figures, raw=results)
    print(f"results: {folder}")


if __name__ == "__main__":
    main()
