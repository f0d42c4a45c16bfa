"""The gateway's relay ceiling: streamed tokens/s through the gateway (with N worker processes) vs direct, at a
load no single client or stand-in process could offer.

    .venv/bin/python bench/gateway_relay.py --streams 64 --cadence-ms 20 --chunks 64 --workers 1,2 --rounds 2  # 1.5 min
    python3 bench/gateway_relay.py --streams 512 --cadence-ms 5 --workers 1,4,8     # the GPU host: bench/gpu/relay.sh

Issue 54's goal: the gateway relays >= 60k streamed tokens/s at >= 0.99x direct (4 H200s of an 8B make that many).
The upstream is `--standins` stand-in engines (bench/harness/mock_upstream.py --reuse-port) on ONE port, as vLLM's
`--api-server-count` shares its port: the gateway sees one upstream, the kernel spreads its connections. Each
streams `--chunks` one-token chunks (vLLM streams one token per chunk), paced on a schedule `--cadence-ms` apart.
The client is `--clients` processes (bench/harness/relay_clients.py) holding `--streams` streamed chat completions
(stream_options.include_usage) in flight: each slot starts its next stream when the last ends, the slots
staggered over one stream's length, so the offered rate is streams x 1000 / cadence-ms tokens/s (512 at 5 ms:
~102k) and steady; a window of `--seconds` is counted once every slot runs. Targets, interleaved round by round
so that drift hits each alike: direct (the stand-ins' port), then the gateway (`python -m stack.entrypoints.gateway
--workers W`, local fast path) for each W of `--workers`. Per target: relayed tokens/s (content chunks that
arrived in the window / its length; the mean of the rounds), x direct, TTFT p50/p99 and stream length of the
streams that started in it, the gateway's CPU (owner + workers) per 1,000 tokens, and the cores each party
used (gateway, stand-ins, clients, and the machine as a whole), all sampled at the window's edges.

DIRECT is the ceiling of the stand-ins and clients on this machine: when it does not reach `--target`, the
verdict says so, and the gateway's rows then say nothing about the goal (only what the machine allowed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.children import Child, Children  # noqa: E402
from bench.harness.relay_clients import Plan, cpu_of, machine_busy, run_round  # noqa: E402
from bench.harness.relay_summary import Tally, row, table, verdict  # noqa: E402
from bench.harness.waiting import free_port, wait_for  # noqa: E402

PY = sys.executable


def auto(value: str) -> int:
    """--standins/--clients: a count, or `auto`: a quarter of the cores each (4 on the 16-core GPU host)."""
    return max(1, (os.cpu_count() or 1) // 4) if value == "auto" else int(value)


def listening(pid: int, port: int) -> bool:
    try:
        return any(c.laddr.port == port and c.status == psutil.CONN_LISTEN
                   for c in psutil.Process(pid).net_connections("tcp"))  # fmt: skip
    except psutil.Error:
        return False


def start_standins(kids: Children, n: int, port: int, chunks: int, cadence_ms: float) -> list[Child]:
    standins = [kids.start(f"standin-{i}", [PY, "bench/harness/mock_upstream.py", "--port", str(port), "--reuse-port",
                                            "--chunks", str(chunks), "--delay-ms", str(cadence_ms)])
                for i in range(n)]  # fmt: skip
    standins[0].wait_http(f"http://127.0.0.1:{port}/health", 30)
    for s in standins:  # each one on the port, not only the first that answered
        wait_for(lambda s=s: listening(s.pid, port) or not s.running(), 30, f"stand-in {s.name} on port {port}")
        if not s.running():
            raise RuntimeError(f"stand-in {s.name} exited: {s.log.read_text()[-2000:]}")
    return standins


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1,4,8", help="comma-separated gateway.workers counts (default 1,4,8)")
    ap.add_argument("--streams", type=int, default=512, help="streams held in flight (default 512)")
    ap.add_argument("--cadence-ms", type=float, default=5, help="the stand-ins' gap between chunks (default 5)")
    ap.add_argument("--chunks", type=int, default=256, help="tokens per stream, one per chunk (default 256)")
    ap.add_argument("--seconds", type=float, default=8, help="the counted window of each round (default 8)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--standins", default="auto", help="stand-in processes on the upstream port (auto: cores/4)")
    ap.add_argument("--clients", default="auto", help="client processes (auto: cores/4)")
    ap.add_argument("--target", type=float, default=60_000, help="the goal's tokens/s (default 60,000)")
    ap.add_argument("--out", type=Path, help="also write the rows and the verdict as JSON here")
    ap.add_argument("--logs", type=Path, help="the stand-ins' and gateways' logs here (default: a temporary folder)")
    args = ap.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    nstand, nclients = auto(args.standins), auto(args.clients)
    cadence_s = args.cadence_ms / 1000
    cores = os.cpu_count() or 1
    with Children(args.logs) as kids:
        up = free_port()
        standins = start_standins(kids, nstand, up, args.chunks, args.cadence_ms)
        targets = [(Tally("direct"), f"http://127.0.0.1:{up}", None)]
        for w in counts:
            port = free_port()
            path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # the GPU site's too
            gw = kids.start(f"gateway-w{w}", [PY, "-m", "stack.entrypoints.gateway", "--upstream",
                                              f"m=http://127.0.0.1:{up}", "--port", str(port), "--workers", str(w)],
                            env={"PYTHONPATH": path})  # fmt: skip
            gw.wait_http(f"http://127.0.0.1:{port}/health", 60)
            targets.append((Tally(f"workers={w}", w), f"http://127.0.0.1:{port}", gw))
        time.sleep(3)  # the workers have connected to their owner

        def sample(gateway: Child | None, clients: list[int]) -> dict[str, float]:
            cpu = {"stand-ins": sum(cpu_of(s.pid) for s in standins), "clients": sum(cpu_of(p) for p in clients),
                   "machine": machine_busy()}  # fmt: skip
            return cpu | ({"gateway": cpu_of(gateway.pid)} if gateway else {})

        print(f"{nstand} stand-ins on :{up}, {nclients} client processes, {cores} cores; {len(targets)} targets "
              f"x {args.rounds} rounds of {args.seconds:g} s (+ {2 * args.chunks * cadence_s:.1f} s ramp and drain)",
              flush=True)  # fmt: skip
        for _, url, gw in targets:  # warm-up: imports, connection pools, the workers' first streams
            plan = Plan.at(url, min(args.streams, 64), min(args.chunks, 32), cadence_s, 1.0)
            run_round(plan, nclients, lambda pids, gw=gw: sample(gw, pids))
        for n in range(args.rounds):
            for tally, url, gw in targets:
                plan = Plan.at(url, args.streams, args.chunks, cadence_s, args.seconds)
                shares, cpu = run_round(plan, nclients, lambda pids, gw=gw: sample(gw, pids))
                tally.add(shares, cpu, plan.window[1] - plan.window[0])
                print(f"round {n + 1} {tally.name}: {tally.rates[-1]:,.0f} tok/s", flush=True)
                time.sleep(1)
    tallies = [t for t, _, _ in targets]
    rows = [row(t, tallies[0]) for t in tallies]
    offered = args.streams * 1000 / args.cadence_ms
    lines = verdict(tallies, offered, args.target, cores)
    print(f"\n{args.streams} streams in flight, {args.chunks} tokens each {args.cadence_ms:g} ms apart; "
          f"{args.rounds} rounds x {args.seconds:g} s counted")  # fmt: skip
    print("\n".join(table(rows)))
    print("\n".join(lines))
    if args.out:
        setup = vars(args) | {"out": str(args.out), "logs": str(args.logs), "standins": nstand, "clients": nclients,
                              "cores": cores, "offered_tokens_per_s": offered}  # fmt: skip
        args.out.write_text(json.dumps({"args": setup, "rows": rows, "verdict": lines}, indent=2) + "\n")


if __name__ == "__main__":
    main()
