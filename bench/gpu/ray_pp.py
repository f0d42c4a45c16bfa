"""Pipeline parallel 2 across two Ray nodes of one GPU each, served through the gateway (issue 15, item 4).

Run by bench/gpu/ray_pp.sh on the lent nvidia-h200-x2 (README "More than one machine" has the device calls).
Two Ray nodes on the one host, each given one GPU (CUDA_VISIBLE_DEVICES set per raylet when it starts, so
Ray hands node 1 GPU 0 and node 2 GPU 1); the stack is built by the composition root with
`manager.runtime: ray` and a Llama-3.1-8B shape (dummy weights) with `pipeline_parallel_size: 2`. The
cluster planner places it across both nodes (tensor parallel 1 within each, pipeline parallel 2), the
engine's API server runs in an actor on node 1 and vLLM's Ray executor places its two workers. Figures:
time to ready, a chat through the gateway, and a short closed loop (TTFT, output tokens/s).

    python3 -m bench.gpu.ray_pp --out $OUT/ray-pp-h200x2.json [--model meta-llama--Llama-3.1-8B-Instruct]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def two_gpu_nodes(cpus: int):
    """Head with GPU 0, a second node with GPU 1 (each raylet reads CUDA_VISIBLE_DEVICES when it starts)."""
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", "600")
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "num_gpus": 1})
        os.environ["CUDA_VISIBLE_DEVICES"] = "1"
        cluster.add_node(num_cpus=cpus, num_gpus=1)
        cluster.wait_for_nodes()
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
    return cluster


def config(state: Path, model_dir: Path, address: str, max_model_len: int):
    from stack.config import load_config

    # Pipeline parallel belongs to this model alone: at the stack level it would apply to every shipped profile.
    entry = {"name": "llama8b", "source": {"path": str(model_dir)}, "served_name": "llama8b",
             "engine": {"pipeline_parallel_size": 2}}
    return load_config(text=json.dumps({
        "models": {"llama8b": entry}, "state_dir": str(state), "startup_timeout_s": 900,
        "engine": {"load_format": "dummy", "max_model_len": max_model_len,
                   "gpu_memory_utilization": 0.85},
        "manager": {"runtime": "ray", "idle_ttl_s": 0, "restart_max": 0, "ray": {"address": address}},
    }))  # fmt: skip


def closed_loop(url: str, n: int, concurrency: int, max_tokens: int) -> dict:
    def one(i: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        ttft, tokens = None, 0
        body = {"model": "llama8b", "prompt": " ".join(f"t{100 + (i * 7 + k) % 900}" for k in range(256)),
                "max_tokens": max_tokens, "ignore_eos": True, "stream": True}  # fmt: skip
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                if line.startswith("data: {") and '"text"' in line:
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    tokens += 1
        return ttft or 0.0, tokens

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        rows = list(pool.map(one, range(n)))
    wall = time.perf_counter() - t0
    ttfts = sorted(r[0] for r in rows)
    return {"requests": n, "concurrency": concurrency, "max_tokens": max_tokens, "wall_s": round(wall, 2),
            "output_tok_per_s": round(sum(r[1] for r in rows) / wall, 1),
            "ttft_p50_ms": round(statistics.median(ttfts) * 1000, 1),
            "ttft_p95_ms": round(ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))] * 1000, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="meta-llama--Llama-3.1-8B-Instruct", help="a stack/planner/known_configs name")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--cpus", type=int, default=8)
    args = ap.parse_args()
    import ray

    from bench.harness.dummy_models import fixture_config, write_model
    from bench.harness.ray_cluster import ray_gateway_for

    result: dict = {"date": time.strftime("%Y-%m-%d"), "model": f"{args.model} (dummy weights)", "ok": False}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_model(Path(tmp) / "models" / "llama8b", fixture_config(args.model))
        cluster = two_gpu_nodes(args.cpus)
        try:
            # The engine's log lands beside the results ($OUT): state/logs/llama8b-r0.log.
            cfg = config(args.out.parent / "ray_pp_state", folder, cluster.address, args.max_model_len)
            with ray_gateway_for(cfg, "llama8b") as (gw, planned):
                result["placement"] = [p.to_dict() for p in planned.cluster.places]
                # The runtime connected this driver to the cluster: Ray's node table answers from here on.
                result["nodes"] = [{"node": n["NodeID"][:8], "gpus": n["Resources"].get("GPU", 0)}
                                   for n in ray.nodes() if n["Alive"]]  # fmt: skip
                deadline = time.monotonic() + 900
                slot = gw.state.manager.slots["llama8b"]
                while str(slot.state) != "ready" and time.monotonic() < deadline:
                    if str(slot.state) == "failed":
                        result["error"] = slot.detail
                        result["log_tail"] = slot.log_tail[-4000:]
                        raise SystemExit(1)
                    time.sleep(1)
                result["ready_s"] = round(time.monotonic() - t0, 1)
                chat = httpx.post(f"{gw.url}/v1/chat/completions", timeout=300, json={
                    "model": "llama8b", "messages": [{"role": "user", "content": "t5 t6 t7"}], "max_tokens": 16})
                result["chat"] = {"status": chat.status_code, "deployment": chat.headers.get("x-vstack-deployment"),
                                  "usage": chat.json().get("usage")}  # fmt: skip
                result["admin_models"] = httpx.get(f"{gw.url}/admin/models", timeout=10).json()["models"]
                result["closed_loop"] = [closed_loop(gw.url, 32, c, 128) for c in (1, 8)]
                result["ok"] = chat.status_code == 200
        finally:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
            ray.shutdown()
            cluster.shutdown()
    print(json.dumps({k: v for k, v in result.items() if k != "admin_models"}, indent=2, default=str))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
