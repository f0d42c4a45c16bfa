"""1 prefill + 1 decode engine vs 2 aggregated replicas, on two H200s, for long prompts (issue 55, item 3b).

Run by bench/gpu/disaggregation.sh (its header has the device calls). One local Ray node that declares the machine's
2 GPUs (Ray gives each replica's actor one of them: CUDA_VISIBLE_DEVICES per engine), the Llama-3.1-8B shape with
dummy weights, built by the composition root with `manager.runtime: ray` and served by the gateway in this process:

- disagg: `disaggregation: {prefill: 1, decode: 1, connector: nixl}`: the gateway sends each request to the prefill
  engine (max_tokens 1, kv_transfer_params do_remote_decode) and then to the decode engine with the prefill's
  kv_transfer_params (vLLM's NixlConnector proxy flow; stack.gateway.routing.disaggregated);
- agg: `manager.ray.replicas: 2`, least_outstanding: each engine prefills and decodes its own requests.

Workload: `vllm bench serve --dataset-name random` on /v1/completions, 8192 tokens in and 256 out (--ignore-eos),
Poisson arrivals at each rate, `--goodput ttft:2000 tpot:40`. The SLO: an 8B prefill of 8k tokens takes ~0.3-0.5 s
on one H200 alone, so 2 s of TTFT leaves room for a few prompts queued ahead (a chat user's wait before the first
word); 40 ms per output token is 25 tok/s per stream, above reading speed, and ~5x an unloaded 8B decode step on
an H200, so it is broken by prefill chunks stalling decode batches (aggregated serving's weakness) long before
the GPU is saturated by decode itself. p95 ITL is reported beside it (goodput takes TPOT, a request's mean ITL).

    python3 -m bench.gpu.disaggregation --config disagg|agg --out $OUT/disaggregation-disagg.json [--rates "2 4 6"]
    python3 -m bench.gpu.disaggregation --table disagg.json agg.json     the side-by-side table of two runs
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SERVED = "llama8b"
SLO = {"ttft": 2000, "tpot": 40}  # ms, per request (vLLM's --goodput)


def two_gpus(cpus: int):
    """A head node with the machine's 2 GPUs: each replica's actor is given one (Ray sets CUDA_VISIBLE_DEVICES)."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "num_gpus": 2})
    cluster.wait_for_nodes()
    return cluster


def config(kind: str, state: Path, model_dir: Path, address: str, max_model_len: int, kv_buffer: str = ""):
    from stack.config import load_config

    entry: dict = {"name": SERVED, "source": {"path": str(model_dir)}, "served_name": SERVED}
    ray: dict = {"address": address, "engine_host": "loopback"}
    if kind != "disagg":
        kv_buffer = ""  # aggregated engines transfer nothing
    if kind == "disagg":
        entry["disaggregation"] = {"prefill": 1, "decode": 1, "connector": "nixl"}
    else:
        ray["replicas"] = {SERVED: 2}
    return load_config(text=json.dumps({
        "models": {SERVED: entry}, "state_dir": str(state), "startup_timeout_s": 900, "fit_check": "warn",
        "engine": {"load_format": "dummy", "max_model_len": max_model_len, "gpu_memory_utilization": 0.85,
                   **({"kv_transfer_config": {"kv_buffer_device": kv_buffer}} if kv_buffer else {})},
        "gateway": {"replica_routing_models": {SERVED: "least_outstanding"}, "num_retries": 0,
                    "request_timeout_s": 600},
        # both configurations without sleep mode: a disaggregated model's engines never have it (adr/0052:
        # NIXL registers their KV cache at start), so the aggregated ones go without it too, like for like
        "manager": {"runtime": "ray", "idle_ttl_s": 0, "restart_max": 0, "ray": ray, "down_keeps_asleep": False},
    }))  # fmt: skip


def bench_serve(url: str, model_dir: Path, rate: float, n: int, seed: int, args, result_dir: Path, name: str) -> dict:
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "openai",
           "--endpoint", "/v1/completions", "--base-url", url, "--model", SERVED, "--tokenizer", str(model_dir),
           "--dataset-name", "random", "--random-input-len", str(args.input_len), "--random-output-len",
           str(args.output_len), "--random-range-ratio", "0", "--num-prompts", str(n), "--request-rate", str(rate),
           "--burstiness", "1", "--seed", str(seed), "--ignore-eos", "--goodput", f"ttft:{SLO['ttft']}",
           f"tpot:{SLO['tpot']}", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles",
           "50,95,99", "--save-result", "--result-dir", str(result_dir),
           "--result-filename", f"{name}.json"]  # fmt: skip
    with open(result_dir / "bench-serve.log", "a") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.run_timeout).returncode
    if rc != 0:
        return {"rc": rc}
    d = json.loads((result_dir / f"{name}.json").read_text())
    pick = lambda key, nd=1: round(d.get(key, -1) or -1, nd)  # noqa: E731
    return {"rc": 0, "completed": d.get("completed"), "goodput_req_s": pick("request_goodput", 2),
            "req_s": pick("request_throughput", 2), "out_tok_s": pick("output_throughput"),
            "ttft_p50_ms": pick("p50_ttft_ms"), "ttft_p95_ms": pick("p95_ttft_ms"), "ttft_p99_ms": pick("p99_ttft_ms"),
            "tpot_p50_ms": pick("p50_tpot_ms", 2), "tpot_p95_ms": pick("p95_tpot_ms", 2),
            "itl_p50_ms": pick("p50_itl_ms", 2), "itl_p95_ms": pick("p95_itl_ms", 2),
            "itl_p99_ms": pick("p99_itl_ms", 2)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=("disagg", "agg"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--table", nargs="+", type=Path, help="print the side-by-side table of these result files")
    ap.add_argument("--model", default="meta-llama--Llama-3.1-8B-Instruct", help="a stack/planner/known_configs name")
    ap.add_argument("--rates", default="2 4 6", help="requests/s, Poisson arrivals")
    ap.add_argument("--input-len", type=int, default=8192)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=40, help="of arrivals per rate: num-prompts = rate x this")
    ap.add_argument("--max-model-len", type=int, default=10240)
    ap.add_argument(
        "--kv-buffer-device",
        default="",
        choices=["", "cuda", "cpu"],
        help="disagg: NIXL's buffer (cpu: a host copy, sent over host memory; its first GPU run's "
        "GPU-to-GPU reads never completed)",
    )
    ap.add_argument("--cpus", type=int, default=16)
    ap.add_argument("--run-timeout", type=float, default=150)
    args = ap.parse_args()
    if args.table:
        print(table([json.loads(p.read_text()) for p in args.table]))
        return 0
    if not args.config or not args.out:
        ap.error("--config and --out (or --table FILES)")
    import ray

    from bench.harness.dummy_models import fixture_config, write_model
    from bench.harness.ray_cluster import ray_gateway_for, wait_replicas

    result: dict = {"date": time.strftime("%Y-%m-%d"), "config": args.config, "model": f"{args.model} (dummy weights)",
                    "slo": {"ttft_ms": SLO["ttft"], "tpot_ms": SLO["tpot"]},
                    "args": {**vars(args), "out": str(args.out), "table": None}, "runs": [], "ok": False}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs_dir = args.out.parent / "disaggregation_runs"
    runs_dir.mkdir(exist_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_model(Path(tmp) / "models" / SERVED, fixture_config(args.model))
        cluster = two_gpus(args.cpus)
        try:
            state = args.out.parent / "disaggregation_state"
            cfg = config(args.config, state, folder, cluster.address, args.max_model_len, args.kv_buffer_device)
            with ray_gateway_for(cfg, SERVED) as (gw, planned):
                result["plan_notes"] = [n for n in planned.default.notes if n.startswith(("disaggregation", "plan:"))]
                result["replicas"] = wait_replicas(gw, 2, 420, SERVED)
                result["ready_s"] = round(time.monotonic() - t0, 1)
                print(f"{args.config}: 2 engines ready in {result['ready_s']} s", flush=True)
                warm = bench_serve(gw.url, folder, 2, 8, 999, args, runs_dir, f"{args.config}-warm")
                result["warm"] = warm
                if args.config == "disagg":  # the flow really went through both engines (not decoded whole)
                    probe = httpx.post(f"{gw.url}/v1/completions", timeout=120, json={
                        "model": SERVED, "prompt": "hello " * 64, "max_tokens": 4})  # fmt: skip
                    result["probe"] = {"status": probe.status_code, "prefill": probe.headers.get("x-vstack-prefill"),
                                       "deployment": probe.headers.get("x-vstack-deployment")}  # fmt: skip
                    print(json.dumps(result["probe"]), flush=True)
                for i, rate in enumerate(float(r) for r in args.rates.split()):
                    n = max(16, round(rate * args.seconds))
                    row = {
                        "config": args.config,
                        "rate": rate,
                        "requests": n,
                        **bench_serve(gw.url, folder, rate, n, i + 1, args, runs_dir, f"{args.config}-r{rate:g}"),
                    }
                    result["runs"].append(row)
                    print(json.dumps(row), flush=True)
                    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")  # a cut call keeps it
                result["ok"] = bool(result["runs"]) and all(r.get("rc") == 0 for r in result["runs"])
        finally:
            args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
            ray.shutdown()
            cluster.shutdown()
    print(table([result]))
    return 0 if result["ok"] else 1


COLUMNS = (("goodput_req_s", "goodput/s"), ("ttft_p95_ms", "TTFT p95"), ("itl_p95_ms", "ITL p95"),
           ("out_tok_s", "out tok/s"))  # fmt: skip


def table(results: list[dict]) -> str:
    """Goodput, TTFT p95, ITL p95 and output tok/s: a row per rate, a column group per configuration."""
    configs = [r["config"] for r in results]
    width = 11 * len(COLUMNS)
    lines = ["rate  " + "  ".join(f"{c:>{width}}" for c in configs),
             "      " + "  ".join("".join(f"{h:>11}" for _, h in COLUMNS) for _ in configs)]  # fmt: skip
    rates = dict.fromkeys(run["rate"] for r in results for run in r["runs"])
    for rate in rates:
        cells = []
        for r in results:
            run = next((x for x in r["runs"] if x["rate"] == rate), {})
            cells.append("".join(f"{run.get(k, '-')!s:>11}" for k, _ in COLUMNS))
        lines.append(f"{rate:<5g} " + "  ".join(cells))
    slo = results[0].get("slo", {}) if results else {}
    lines.append(f"goodput: requests/s within TTFT <= {slo.get('ttft_ms')} ms and TPOT <= {slo.get('tpot_ms')} ms")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
