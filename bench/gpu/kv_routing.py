"""Replica routing on the engines' KV events vs prefix affinity vs round robin (issue 55, item 3a).

Run by bench/gpu/kv_routing.sh (its header has the device calls). One local Ray node, 2 replicas of the
Llama-3.1-8B shape (dummy weights, prefix caching on, their KV events published): one GPU each on nvidia-h200-x2,
or both on the one H200 of nvidia-h200 (RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES). Each replica holds
`--gpu-memory-utilization` (0.3) of its GPU, so its KV cache (~190k tokens) is smaller than the workload's prefixes
(64 x 4k + suffixes, ~280k): a replica that is sent every prefix evicts, one sent half of them keeps them. Built by
the composition root with `manager.runtime: ray`, served by the gateway in this process, whose replica routing is
switched between runs. Workload: vLLM's own `vllm bench serve --dataset-name prefix_repetition` on /v1/completions:
`--prefixes` shared prefixes (system prompts of `--prefix-len` tokens) each followed by a distinct suffix, Poisson
arrivals at each rate. Each (rate, strategy) run has a seed of its own, so its prefixes are new text: no run is
served from a cache an earlier run filled.

    python3 -m bench.gpu.kv_routing --out $OUT/kv-routing.json [--rates "8 16"] [--strategies ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SERVED = "llama8b"
STRATEGIES = ("kv_events", "prefix_affinity", "round_robin")


def ray_node(cpus: int, gpus: int):
    """A local Ray head node for 2 replicas: on a machine with 2 GPUs each replica's engine gets one of its own;
    on one H200 the node declares 2 GPUs on the one card (RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: both
    engines see the physical GPU and share its memory)."""
    from ray.cluster_utils import Cluster

    if gpus < 2:
        os.environ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "num_gpus": 2})
    cluster.wait_for_nodes()
    return cluster


def visible_gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def config(state: Path, model_dir: Path, address: str, max_model_len: int, memory: float):
    from stack.config import load_config

    entry = {"name": SERVED, "source": {"path": str(model_dir)}, "served_name": SERVED}
    return load_config(text=json.dumps({
        "models": {SERVED: entry}, "state_dir": str(state), "startup_timeout_s": 900, "fit_check": "warn",
        "engine": {"load_format": "dummy", "max_model_len": max_model_len, "gpu_memory_utilization": memory,
                   "enable_prefix_caching": True},
        "gateway": {"replica_routing_models": {SERVED: "kv_events"}, "num_retries": 1},
        "manager": {"runtime": "ray", "idle_ttl_s": 0, "restart_max": 0,
                    "ray": {"address": address, "replicas": {SERVED: 2}, "engine_host": "loopback"}},
    }))  # fmt: skip


def bench_serve(url: str, model_dir: Path, rate: float, n: int, seed: int, args, result_dir: Path, name: str,
                prefixes: int | None = None) -> dict:  # fmt: skip
    """One `vllm bench serve` client; with `args.hot_share` two at once (mixed)."""
    if args.hot_share and prefixes is None:
        return mixed(url, model_dir, rate, n, seed, args, result_dir, name)
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "openai",
           "--endpoint", "/v1/completions", "--base-url", url, "--model", SERVED, "--tokenizer", str(model_dir),
           "--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(args.prefix_len),
           "--prefix-repetition-suffix-len", str(args.suffix_len), "--prefix-repetition-num-prefixes",
           str(prefixes or args.prefixes), "--prefix-repetition-output-len", str(args.output_len), "--num-prompts",
           str(n), "--request-rate", str(rate), "--burstiness", "1", "--seed", str(seed), "--ignore-eos",
           "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,90,99", "--save-result",
           "--save-detailed", "--result-dir", str(result_dir), "--result-filename", f"{name}.json"]  # fmt: skip
    with open(result_dir / "bench-serve.log", "a") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.run_timeout).returncode
    if rc != 0:
        return {"rc": rc}
    d = json.loads((result_dir / f"{name}.json").read_text())
    return {"rc": 0, "completed": d.get("completed"), "ttft_p50_ms": round(d.get("p50_ttft_ms", -1), 1),
            "ttft_p90_ms": round(d.get("p90_ttft_ms", -1), 1), "ttft_p99_ms": round(d.get("p99_ttft_ms", -1), 1),
            "tpot_p50_ms": round(d.get("p50_tpot_ms", -1), 2), "out_tok_s": round(d.get("output_throughput", 0), 1),
            "req_s": round(d.get("request_throughput", 0), 2)}  # fmt: skip


def mixed(url: str, model_dir: Path, rate: float, n: int, seed: int, args, result_dir: Path, name: str) -> dict:
    """`args.hot_share` of the arrivals on one prefix of their own (an app's system prompt), the rest on
    `args.prefixes` (many sessions'): two Poisson clients at once, their requests pooled into one result
    (bench.gpu.serve_rows.merge, the BENCH_CLIENTS merge) and its percentiles taken over every request."""
    from concurrent.futures import ThreadPoolExecutor

    from bench.gpu.serve_rows import merge
    from stack.load.summary import percentile

    hot_rate, hot_n = rate * args.hot_share, max(8, round(n * args.hot_share))
    with ThreadPoolExecutor(2) as pool:
        hot = pool.submit(bench_serve, url, model_dir, hot_rate, hot_n, seed + 10_000, args, result_dir,
                          f"{name}-hot", 1)  # fmt: skip
        cold = pool.submit(bench_serve, url, model_dir, rate - hot_rate, max(8, n - hot_n), seed, args, result_dir,
                           f"{name}-cold", args.prefixes)  # fmt: skip
        parts = {"hot": hot.result(), "cold": cold.result()}
    if any(p.get("rc") != 0 for p in parts.values()):
        return {"rc": max(abs(p.get("rc") or 0) for p in parts.values()) or 1, "parts": parts}
    merged = merge([json.loads((result_dir / f"{name}-{k}.json").read_text()) for k in parts])
    ttfts = [t * 1000 for t in merged["ttfts"]]
    return {"rc": 0, "completed": merged["completed"], "ttft_p50_ms": round(percentile(ttfts, 50), 1),
            "ttft_p90_ms": round(percentile(ttfts, 90), 1), "ttft_p99_ms": round(percentile(ttfts, 99), 1),
            "tpot_p50_ms": round(merged["median_tpot_ms"], 2), "out_tok_s": round(merged["output_throughput"], 1),
            "req_s": round(merged["request_throughput"], 2),
            "parts": {k: {x: v.get(x) for x in ("ttft_p90_ms", "req_s")} for k, v in parts.items()}}  # fmt: skip


def engine_counters(url: str, dep_ids: list[str]) -> dict[str, float]:
    from bench.harness.scrape import sample_sums

    names = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
    text = "".join(httpx.get(f"{url}/metrics/engines/{d}", timeout=10).text for d in dep_ids)
    return sample_sums(text, names)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="meta-llama--Llama-3.1-8B-Instruct", help="a stack/planner/known_configs name")
    ap.add_argument("--rates", default="24 32", help="requests/s, Poisson arrivals")
    ap.add_argument(
        "--strategies",
        default=" ".join(STRATEGIES),
        help="kv_events@W: kv_events with gateway.kv_events_load_weight W (default: the setting's);"
        " kv_events-unbalanced: without its balance rule (gateway.kv_events_balance_threshold: null)",
    )
    ap.add_argument("--prefixes", type=int, default=64, help="shared prefixes (sessions' system prompts)")
    ap.add_argument("--hot-share", type=float, default=0.0, help="this share of the arrivals on one more prefix")
    ap.add_argument("--prefix-len", type=int, default=4096)
    ap.add_argument("--suffix-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=30, help="of arrivals per run: num-prompts = rate x this")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.3,
        help="of each replica's GPU: 0.3 of an H200 holds ~190k tokens of the 8B's KV, less than the"
        " prefixes' ~280k, so a replica that sees every prefix evicts (the cache pressure routing is for)",
    )
    ap.add_argument("--cpus", type=int, default=8)
    ap.add_argument("--run-timeout", type=float, default=240)
    args = ap.parse_args()
    import ray

    from bench.harness.dummy_models import fixture_config, write_model
    from bench.harness.ray_cluster import ray_gateway_for, wait_replicas

    result: dict = {"date": time.strftime("%Y-%m-%d"), "model": f"{args.model} (dummy weights)",
                    "args": dict(vars(args)),
                    "runs": [], "ok": False}  # fmt: skip
    result["args"]["out"] = str(args.out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs_dir = args.out.parent / "kv_routing_runs"
    runs_dir.mkdir(exist_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_model(Path(tmp) / "models" / SERVED, fixture_config(args.model))
        gpus = visible_gpus()
        result["gpus"] = gpus
        cluster = ray_node(args.cpus, gpus)
        try:
            cfg = config(
                args.out.parent / "kv_routing_state",
                folder,
                cluster.address,
                args.max_model_len,
                args.gpu_memory_utilization,
            )
            with ray_gateway_for(cfg, SERVED) as (gw, _planned):
                wait_replicas(gw, 2, 900, SERVED)
                result["ready_s"] = round(time.monotonic() - t0, 1)
                book = gw.state.routing.replicas
                default_weight, default_balance = book.load_weight, book.balance_threshold
                ids = sorted(d.id for d in gw.state.registry.all() if "replica" in d.labels)
                # the warm-up (one client) loads the tokenizer
                bench_serve(gw.url, folder, 4, 16, 999, args, runs_dir, "warm", args.prefixes)
                seed = 0
                for rate in [float(r) for r in args.rates.split()]:
                    for strategy in args.strategies.split():
                        seed += 1
                        name, _, weight = strategy.partition("@")  # kv_events@1: its load weight
                        name, unbalanced = name.removesuffix("-unbalanced"), name.endswith("-unbalanced")
                        book.per_group[SERVED] = type(book.routing)(name)
                        book.load_weight = float(weight) if weight else default_weight
                        book.balance_threshold = None if unbalanced else default_balance
                        made = Counter(book.choices.get(SERVED, {}))
                        before = engine_counters(gw.url, ids)
                        n = max(32, round(rate * args.seconds))
                        row = {
                            "strategy": strategy,
                            "rate": rate,
                            "requests": n,
                            **bench_serve(gw.url, folder, rate, n, seed, args, runs_dir, f"{strategy}-r{rate:g}"),
                        }
                        after = engine_counters(gw.url, ids)
                        q = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
                        h = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
                        row["prefix_hit_rate"] = round(h / q, 3) if q else None
                        row["choices"] = dict(Counter(book.choices.get(SERVED, {})) - made)  # by cache, balance ...
                        row["kv_index"] = {i: book.kv.describe(i) for i in ids}
                        result["runs"].append(row)
                        print(json.dumps({k: v for k, v in row.items() if k != "kv_index"}), flush=True)
                        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")  # a cut call keeps it
                result["ok"] = all(r.get("rc") == 0 for r in result["runs"])
        finally:
            args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
            ray.shutdown()
            cluster.shutdown()
    print(table(result["runs"]))
    return 0 if result["ok"] else 1


def table(runs: list[dict]) -> str:
    """TTFT p50/p90 and output tok/s side by side: a row per rate, a column group per strategy."""
    strategies = list(dict.fromkeys(r["strategy"] for r in runs))
    lines = ["rate  " + "  ".join(f"{s:>32}" for s in strategies),
             "      " + "  ".join(f"{'p50 ms':>10} {'p90 ms':>10} {'tok/s':>10}" for _ in strategies)]  # fmt: skip
    for rate in dict.fromkeys(r["rate"] for r in runs):
        cells = []
        for s in strategies:
            r = next((r for r in runs if r["rate"] == rate and r["strategy"] == s), {})
            cells.append(
                f"{r.get('ttft_p50_ms', '-'):>10} {r.get('ttft_p90_ms', '-'):>10} {r.get('out_tok_s', '-'):>10}"
            )
        lines.append(f"{rate:<5g} " + "  ".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
