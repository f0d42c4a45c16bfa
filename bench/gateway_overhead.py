"""What the gateway adds to a request: direct vs our gateway vs LiteLLM's proxy server, in one run.

    .venv/bin/python bench/gateway_overhead.py                      # mock upstreams only
    .venv/bin/python bench/gateway_overhead.py --vllm-url http://127.0.0.1:8100 --vllm-model NAME
    .venv/bin/python bench/gateway_overhead.py --compare-tree ../old    # + the gateway of another checkout

`--console` adds a target "console": a second gateway of this tree, the same as "vstack", with the browser
console open on it and streaming (`--console-pages` pages, each one Server-Sent Events stream of every topic:
models, live, activity, log, read for the whole run), so that what an open console costs `/v1` shows side by side
with the gateway nobody watches. `--no-litellm` leaves LiteLLM's proxy out (a shorter run).

`--floor` adds a target "floor": a TCP proxy that only forwards bytes (bench/harness/byte_proxy.py) in front
of the paced upstream, in the same rounds: what one more process between client and upstream costs on this
machine before any HTTP work, so the gateway's added latency reads against the floor under every proxy. It adds
"http-floor" too (bench/harness/http_floor.py): a bare ASGI proxy on the gateway's own libraries (uvicorn,
httptools, uvloop, aiohttp) with no checks, routing or counting: the floor under any gateway built on them.

`--tracing` adds two targets (adr/0042): "kept", a gateway of this tree keeping its last 500 requests' spans for
the console (observability.tracing.keep: 500, nothing exported), and "traced", one exporting every request's
spans (sample ratio 1.0) over OTLP/HTTP to a receiver in its own process (bench/harness/otlp_receiver.py, the
stand-in for a collector). "vstack" is the default: tracing off, no tracer at all.

`--open-loop` adds the same latency rows with open-loop arrivals, the way serving benchmarks measure latency
(vLLM's `bench serve`, Poisson arrivals): requests arrive at random (exponential gaps, one seeded schedule for
every target of a round) at the rate that keeps c streams in flight on average (c / the paced stream's length),
whether the last one has ended or not. The closed loop keeps exactly c in flight, and since every paced stream
is as long as the next, its c clients stay in step: c requests arrive within a millisecond of each other every
stream length, and a one-threaded proxy handles them one after another (the last waits c x its request path).
Open loop, arrivals bunch only as often as chance makes them. Both are printed; neither replaces the other.

`--compare-tree DIR` adds a fourth target, "before": the gateway of another checkout of this repository (e.g.
`git worktree add ../old COMMIT`), run from that tree with the same Python, in the same interleaved rounds:
a regression check measured side by side instead of against a figure from another day.

Upstreams: a fast local OpenAI-compatible streaming server (bench/harness/mock_upstream.py) that isolates the
proxy's own cost, twice: paced like an engine (`--cadence-ms` between its `--chunks` chunks) for the
added-latency figures, and unpaced for the max requests/s; and, when given, a real vLLM.
Proxies: our gateway (`python -m stack.entrypoints.gateway`, local fast path) and `litellm --config` (1 worker),
each in its own process, started and stopped here. Rounds are interleaved so drift hits all alike.

Added latency = a percentile of end-to-end stream time through the proxy minus the same percentile
direct. Targets (issue 3): <= 1 ms p50 and <= 5 ms p99 added at 32 concurrent streams; >= 3x LiteLLM's
max requests/s. Results print as a table and go to bench/results/<date>-<device>-gateway-overhead/ (with its
manifest.json; bench.harness.results), or to `--out FILE` only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.children import Children  # noqa: E402
from bench.harness.manifest import Figure  # noqa: E402
from bench.harness.results import record  # noqa: E402
from bench.harness.stream_load import Sample, Target, load, load_open, pct  # noqa: E402
from bench.harness.waiting import free_port  # noqa: E402

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: no cost-map fetch
PY = sys.executable
MASTER_KEY = "sk-bench-master"  # LiteLLM's proxy requires one; local only, nothing to protect


def litellm_config(upstreams: dict[str, tuple[str, str]], path: Path) -> None:
    lines = ["model_list:"]
    for model, (url, served) in upstreams.items():
        lines += [
            f"  - model_name: {model}",
            "    litellm_params:",
            f"      model: openai/{served}",
            f"      api_base: {url}/v1",
            "      api_key: none",
        ]
    lines += ["general_settings:", f"  master_key: {MASTER_KEY}", "litellm_settings:", "  drop_params: true"]
    path.write_text("\n".join(lines) + "\n")


# -- the run ---------------------------------------------------------------------------------------
async def run(args: argparse.Namespace) -> dict:
    with Children() as procs:
        paced, fast = free_port(), free_port()
        mock = [PY, "bench/harness/mock_upstream.py", "--chunks", str(args.chunks)]
        mock_paced = procs.start("mock-paced", [*mock, "--port", str(paced), "--delay-ms", str(args.cadence_ms),
                                                "--name", "paced"])
        mock_fast = procs.start("mock-fast", [*mock, "--port", str(fast), "--name", "fast"])
        upstreams = {
            "paced": (f"http://127.0.0.1:{paced}", "paced"),
            "fast": (f"http://127.0.0.1:{fast}", "fast"),
        }
        if args.vllm_url:
            upstreams["vllm"] = (args.vllm_url.rstrip("/").removesuffix("/v1"), args.vllm_model)
        floor = free_port() if args.floor else None
        if floor:
            byte_proxy = procs.start("floor", [PY, "bench/harness/byte_proxy.py", "--port", str(floor), "--target",
                                               f"127.0.0.1:{paced}"])  # fmt: skip
        http_floor = free_port() if args.floor else None
        if http_floor:
            http_floor_proc = procs.start("http-floor", [PY, "bench/harness/http_floor.py", "--port", str(http_floor),
                                                         "--target", f"http://127.0.0.1:{paced}"])  # fmt: skip
        gw, lt = free_port(), free_port()
        gw_argv = [PY, "-m", "stack.entrypoints.gateway", "--port", str(gw)]
        for model, (url, served) in upstreams.items():
            gw_argv += ["--upstream", f"{model}={url}@{served}"]
        gateway = procs.start("gateway", gw_argv)
        tracing_ports = (free_port(), free_port(), free_port()) if args.tracing else None
        if tracing_ports:
            kept, traced, receiver = tracing_ports
            otlp = procs.start("otlp-receiver", [PY, "bench/harness/otlp_receiver.py", "--port", str(receiver)])
            for name, port, tracing in (("kept", kept, {"keep": 500}),
                                        ("traced", traced, {"endpoint": f"http://127.0.0.1:{receiver}",
                                                            "sample_ratio": 1.0})):  # fmt: skip
                cfg_file = procs.logs / f"{name}.yaml"
                cfg_file.write_text(json.dumps({"observability": {"tracing": tracing}}))
                procs.start(f"gateway-{name}", [*gw_argv[:4], str(port), "--config", str(cfg_file), *gw_argv[5:]])
        watched = free_port() if args.console else None
        gateway_console = (procs.start("gateway-console", [*gw_argv[:4], str(watched), *gw_argv[5:]])
                           if watched else None)  # fmt: skip
        before = free_port() if args.compare_tree else None
        if before:
            tree = Path(args.compare_tree).resolve()
            # Before the one-house layout (issue 16) the gateway's entry point was `stack.gateway`.
            new_layout = (tree / "stack/entrypoints/gateway.py").is_file()
            entry = "stack.entrypoints.gateway" if new_layout else "stack.gateway"
            old_argv = [PY, "-m", entry, "--port", str(before), *gw_argv[5:]]  # the same upstreams
            gateway_before = procs.start("gateway-before", old_argv, {"PYTHONPATH": str(tree)}, cwd=tree)
        litellm = None
        if args.litellm:
            cfg = procs.logs / "litellm.yaml"
            litellm_config(upstreams, cfg)
            env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
            litellm_bin = str(Path(PY).with_name("litellm"))
            litellm = procs.start("litellm", [litellm_bin, "--config", str(cfg), "--port", str(lt), "--num_workers",
                                              "1"], env)  # fmt: skip
        auth = {"Authorization": f"Bearer {MASTER_KEY}"}
        mock_paced.wait_http(f"http://127.0.0.1:{paced}/health", 30, interval=0.25)
        mock_fast.wait_http(f"http://127.0.0.1:{fast}/health", 30, interval=0.25)
        if floor:
            byte_proxy.wait_http(f"http://127.0.0.1:{floor}/health", 30, interval=0.25)
        if http_floor:
            http_floor_proc.wait_http(f"http://127.0.0.1:{http_floor}/health", 60, interval=0.25)
        gateway.wait_http(f"http://127.0.0.1:{gw}/health", 60, interval=0.25)
        if tracing_ports:
            otlp.wait_http(f"http://127.0.0.1:{tracing_ports[2]}/health", 30, interval=0.25)
            for port in tracing_ports[:2]:
                gateway.wait_http(f"http://127.0.0.1:{port}/health", 60, interval=0.25)
        if before:
            gateway_before.wait_http(f"http://127.0.0.1:{before}/health", 60, interval=0.25)
        if gateway_console is not None:
            gateway_console.wait_http(f"http://127.0.0.1:{watched}/health", 60, interval=0.25)
        if litellm is not None:
            litellm.wait_http(f"http://127.0.0.1:{lt}/health/liveliness", 120, headers=auth, interval=0.25)

        def targets(model: str) -> list[Target]:
            url, served = upstreams[model]
            return [
                Target("direct", url, served),
                *([Target("floor", f"http://127.0.0.1:{floor}", served)] if floor and model == "paced" else []),
                *([Target("http-floor", f"http://127.0.0.1:{http_floor}", served)]
                  if http_floor and model == "paced" else []),
                *([Target("kept", f"http://127.0.0.1:{tracing_ports[0]}", model)] if tracing_ports else []),
                Target("vstack", f"http://127.0.0.1:{gw}", model),
                *([Target("traced", f"http://127.0.0.1:{tracing_ports[1]}", model)] if tracing_ports else []),
                *([Target("console", f"http://127.0.0.1:{watched}", model)] if watched else []),
                *([Target("before", f"http://127.0.0.1:{before}", model)] if before else []),
                *([Target("litellm", f"http://127.0.0.1:{lt}", model, auth)] if args.litellm else []),
            ]

        pages = ConsolePages(f"http://127.0.0.1:{watched}", args.console_pages) if watched else None
        if pages is not None:
            await pages.open()

        for t in targets("fast"):  # warm-up: connections, JIT-free but caches and imports
            await load(t, 4, 40, None, args.chunks)
        results: dict = {"latency": [], "latency_open": [], "throughput": [], "vllm": []}
        for c in args.concurrency:
            per: dict[str, Sample] = {}
            for _ in range(args.rounds):
                for t in targets("paced"):
                    s = await load(t, c, max(args.requests, args.requests_per_client * c), None, args.chunks)
                    per[t.name] = per[t.name] + s if t.name in per else s
            results["latency"].append(summarise_latency(c, per))
            print_row_latency(results["latency"][-1])
        stream_s = args.chunks * args.cadence_ms / 1e3  # a paced stream's length: c / it arrivals per second
        for c in args.concurrency if args.open_loop else []:
            per = {}
            n = max(args.requests, args.requests_per_client * c)
            for r in range(args.rounds):
                for t in targets("paced"):
                    s = await load_open(t, c / stream_s, n, seed=1000 * c + r, max_tokens=args.chunks)
                    per[t.name] = per[t.name] + s if t.name in per else s
            results["latency_open"].append(summarise_latency(c, per))
            print_row_latency(results["latency_open"][-1], label="open loop")
        tp: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for t in targets("fast"):
                s = await load(t, args.throughput_concurrency, None, args.throughput_seconds, args.chunks)
                tp.setdefault(t.name, []).append(s.rps)
                if s.errors:
                    print(f"  ({t.name}: {s.errors} errors)")
        results["throughput"] = {name: max(v) for name, v in tp.items()}
        if args.litellm:
            results["throughput"]["vstack_over_litellm"] = (
                results["throughput"]["vstack"] / results["throughput"]["litellm"]
            )
        print_throughput(results["throughput"], args.throughput_concurrency)
        if args.vllm_url:
            for c in args.vllm_concurrency:
                per = {}
                for _ in range(args.rounds):
                    for t in targets("vllm"):
                        s = await load(t, c, args.vllm_requests, None, args.vllm_max_tokens)
                        per[t.name] = per[t.name] + s if t.name in per else s
                results["vllm"].append(summarise_latency(c, per))
                print_row_latency(results["vllm"][-1], label="vLLM")
        if pages is not None:
            results["console_events"] = await pages.close()
            print(f"console: {args.console_pages} pages streamed {results['console_events']} events during the run",
                  flush=True)
        return results


class ConsolePages:
    """Browser tabs on the console, as the bench sees them: each its own session (cookie) and one event stream of
    every topic, read until closed. The gateway has no key, so a loopback page gets its session at once."""

    def __init__(self, url: str, n: int) -> None:
        self.url, self.n = url, n
        self.events = 0
        self.tasks: list[asyncio.Task] = []
        self.sessions: list[aiohttp.ClientSession] = []

    async def open(self) -> None:
        for _ in range(self.n):
            # unsafe=True: aiohttp keeps no cookie of an IP address (127.0.0.1) otherwise
            session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                            cookie_jar=aiohttp.CookieJar(unsafe=True))
            self.sessions.append(session)
            async with session.get(f"{self.url}/ui/live") as page:  # the session cookie
                if page.status != 200:
                    raise RuntimeError(f"console page: HTTP {page.status}")
            self.tasks.append(asyncio.create_task(self._read(session)))
        await asyncio.sleep(1.5)
        if not self.events:
            raise RuntimeError("the console streams sent nothing: is the console on?")

    async def _read(self, session: aiohttp.ClientSession) -> None:
        url = f"{self.url}/ui/api/events?topics=models,live,activity,log"
        async with session.get(url) as resp:
            if resp.status != 200:
                raise RuntimeError(f"console stream: HTTP {resp.status}")
            async for line in resp.content:
                if line.startswith(b"event:"):
                    self.events += 1

    async def close(self) -> int:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for session in self.sessions:
            await session.close()
        return self.events


PROXIES = ("floor", "http-floor", "vstack", "kept", "traced", "console", "before", "litellm")


def summarise_latency(c: int, per: dict[str, Sample]) -> dict:
    d = per["direct"]
    row: dict = {
        "concurrency": c,
        "n": len(d.e2e),
        "direct_p50_ms": pct(d.e2e, 50) * 1e3,
        "direct_p99_ms": pct(d.e2e, 99) * 1e3,
    }
    for name in PROXIES:
        if name not in per:
            continue
        s = per[name]
        row[f"{name}_added_p50_ms"] = (pct(s.e2e, 50) - pct(d.e2e, 50)) * 1e3
        row[f"{name}_added_p99_ms"] = (pct(s.e2e, 99) - pct(d.e2e, 99)) * 1e3
        row[f"{name}_added_ttft_p50_ms"] = (pct(s.ttft, 50) - pct(d.ttft, 50)) * 1e3
        row[f"{name}_errors"] = s.errors
    row["direct_mean_ms"] = statistics.fmean(d.e2e) * 1e3 if d.e2e else float("nan")
    return row


def print_row_latency(r: dict, label: str = "paced mock") -> None:
    print(
        f"{label:10} c={r['concurrency']:<3} "
        f"direct p50 {r['direct_p50_ms']:8.2f} ms p99 {r['direct_p99_ms']:8.2f} | "
        + " | ".join(f"{name} +{r[f'{name}_added_p50_ms']:6.2f} / +{r[f'{name}_added_p99_ms']:6.2f} ms"
                     for name in PROXIES
                     if f"{name}_added_p50_ms" in r)
        + " (p50 / p99 added)",
        flush=True,
    )


def print_throughput(tp: dict, c: int) -> None:
    print(
        f"max req/s (fast mock, c={c}): "
        + ", ".join(f"{name} {tp[name]:.0f}" for name in ("direct", *PROXIES) if name in tp)
        + (f" -> vstack/litellm = {tp['vstack_over_litellm']:.1f}x" if "vstack_over_litellm" in tp else ""),
        flush=True,
    )


def machine() -> dict:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    from importlib.metadata import version

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "litellm": version("litellm"),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
    }


def _c1(results: dict) -> dict:
    return min(results["latency"], key=lambda row: row["concurrency"])


def figures(results: dict) -> list[Figure]:
    """What the manifest and docs/performance.md show of a run."""
    c1, tp = _c1(results), results["throughput"]
    c = c1["concurrency"]
    out = [Figure(name=f"vstack added p50, c={c}", value=round(c1["vstack_added_p50_ms"], 3), unit="ms",
                  meaning="latency the gateway adds to a streamed request over the direct upstream (paced mock); "
                          "lower is better"),
           Figure(name=f"LiteLLM added p50, c={c}", value=round(c1["litellm_added_p50_ms"], 3), unit="ms",
                  meaning="the same for LiteLLM's proxy (1 worker); lower is better"),
           Figure(name="vstack max req/s", value=round(tp["vstack"], 1), unit="req/s",
                  meaning="streamed requests per second through the gateway, fast mock; higher is better"),
           Figure(name="LiteLLM max req/s", value=round(tp["litellm"], 1), unit="req/s",
                  meaning="the same through LiteLLM's proxy"),
           Figure(name="vstack / LiteLLM req/s", value=round(tp["vstack_over_litellm"], 2), unit="x",
                  meaning="how many times LiteLLM's throughput the gateway serves")]
    if "before_added_p50_ms" in c1:
        out.insert(1, Figure(name=f"other tree added p50, c={c}", value=round(c1["before_added_p50_ms"], 3), unit="ms",
                             meaning="the compared checkout's gateway (--compare-tree), same interleaved rounds"))
    if "floor_added_p50_ms" in c1:
        out.insert(0, Figure(name=f"floor added p50, c={c}", value=round(c1["floor_added_p50_ms"], 3), unit="ms",
                             meaning="a TCP proxy that only forwards bytes (--floor): one more process in the path, "
                                     "no HTTP; what no proxy goes below on this machine"))
    if "http-floor_added_p50_ms" in c1:
        out.insert(1, Figure(name=f"HTTP floor added p50, c={c}", value=round(c1["http-floor_added_p50_ms"], 3),
                             unit="ms", meaning="a bare ASGI proxy on the gateway's libraries (uvicorn, httptools, "
                                                "uvloop, aiohttp), no checks: the floor under a gateway built on them"))
    if "before" in tp:
        out.insert(3, Figure(name="other tree max req/s", value=round(tp["before"], 1), unit="req/s",
                             meaning="the compared checkout's gateway, same rounds"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=100, help="at least this many per target and round (latency)")
    ap.add_argument("--requests-per-client", type=int, default=20, help="latency: requests = max(this x c, --requests)")
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--cadence-ms", type=float, default=10, help="paced mock: ms between chunks, like an engine")
    ap.add_argument("--throughput-concurrency", type=int, default=32)
    ap.add_argument("--throughput-seconds", type=float, default=8)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (direct, vstack, litellm)")
    ap.add_argument("--vllm-url")
    ap.add_argument("--vllm-model")
    ap.add_argument("--vllm-concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    ap.add_argument("--vllm-requests", type=int, default=12)
    ap.add_argument("--vllm-max-tokens", type=int, default=16)
    ap.add_argument("--compare-tree", help="another checkout of this repo: its gateway runs side by side")
    ap.add_argument("--floor", action="store_true", help="add a byte-forwarding TCP proxy: the floor under any proxy")
    ap.add_argument("--console", action="store_true", help="add a gateway with the browser console open and streaming")
    ap.add_argument("--console-pages", type=int, default=4, help="--console: how many open pages (event streams)")
    ap.add_argument("--tracing", action="store_true", help="add gateways with no tracer and with every request "
                    "exported over OTLP: what tracing costs, side by side")
    ap.add_argument("--open-loop", action="store_true",
                    help="add latency rows with open-loop (Poisson) arrivals at c streams in flight on average")
    ap.add_argument("--no-litellm", dest="litellm", action="store_false", help="leave LiteLLM's proxy out")
    ap.add_argument("--out", type=Path, help="write the raw JSON here only (default: a run folder under "
                    "bench/results with its manifest)")
    args = ap.parse_args()
    if not args.litellm and args.out is None:  # a recorded run's figures compare against LiteLLM's proxy
        ap.error("--no-litellm writes the raw JSON only: give --out FILE")
    if args.vllm_url and not args.vllm_model:
        ap.error("--vllm-url needs --vllm-model (the engine's served model name)")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    info = machine()
    print(f"# {info['date']} | {info['cpu']} x{info['cores']} | python {info['python']} | litellm {info['litellm']}")
    results = asyncio.run(run(args))
    results["machine"] = info
    results["args"] = vars(args)
    if args.out:
        out = ROOT / args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2, default=str))
    else:
        tp = results["throughput"]
        added = _c1(results)["vstack_added_p50_ms"]
        summary = (f"gateway overhead vs LiteLLM's proxy ({args.rounds} rounds): +{added:.1f} ms p50 added at c=1, "
                   f"{tp['vstack_over_litellm']:.1f}x LiteLLM's req/s")
        out = record("gateway-overhead-side-by-side" if args.compare_tree else "gateway-overhead", summary,
                     figures(results), raw=results, litellm=info["litellm"])
    for key, how in (("latency", "closed loop"), ("latency_open", "open loop")):
        for row in results[key]:
            if row["concurrency"] in (1, 32):
                ok = row["vstack_added_p50_ms"] <= 1 and row["vstack_added_p99_ms"] <= 5
                print(f"target c={row['concurrency']} ({how}) added <= 1 ms p50 / 5 ms p99: "
                      f"{'met' if ok else 'NOT met'}")
    ratio = results["throughput"].get("vstack_over_litellm")
    if ratio is not None:
        print(f"target >= 3x LiteLLM max req/s: {'met' if ratio >= 3 else 'NOT met'} ({ratio:.1f}x)")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
