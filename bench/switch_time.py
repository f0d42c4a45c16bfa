"""Switch time: from a request for model B while A is active to B's first token, per kind, next to plain
vLLM doing the same, measured in one run (issue 4, item 7).

    kinds   ours (vstack manager)                              plain vLLM
    cold    A ready, one fits: request B -> A stopped (CPU)    `vllm serve B` start -> first token
            or put to sleep (GPU), B started, first token
    sleep   A ready, B asleep: request B -> A sleeps, B wakes  POST A/sleep + POST B/wake_up + first token
    resident A and B ready: request B after A -> first token   first token of B, straight to its engine

    python bench/switch_time.py --model-a DIR --model-b DIR [--through gateway|manager] [--out F.json]  (CPU)
    python3 bench/switch_time.py --gpu --scenario pair|round|trio [--repeat N] --out F.json           (GPU)

Without --out, a CPU run lands in bench/results/<date>-cpu-switch-time/ with its manifest (bench.harness).

--gpu (the lent GPU machine, bench/gpu/switch_time.sh): bench/switch_gpu.py, ours with and without the
overlapped wake, raw vLLM sleep + wake by hand, and the bus limit from a pinned copy, on the same engines.

--through gateway (default where LiteLLM is installed) sends every request through the real gateway (the
manager admits it, the dispatcher streams it); --through manager asks the manager for admission and then
streams from the engine itself (the lent GPU machine has no LiteLLM; the gateway adds ~1-2 ms, see
bench/gateway_overhead.py). CPU: no sleep mode, so the `sleep` kind is skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness.children import Child, Children  # noqa: E402
from bench.harness.manifest import Figure  # noqa: E402
from bench.harness.results import record  # noqa: E402
from bench.harness.waiting import free_port  # noqa: E402

GIB = 1024**3


@dataclass
class Setup:
    launcher: list[str]
    extra: list[str]
    env: dict[str, str]
    logs: Path
    gpu: bool

    def argv(self, model: str, served: str, port: int) -> list[str]:
        return [*self.launcher, "serve", model, "--host", "127.0.0.1", "--port", str(port),
                "--served-model-name", served, *self.extra]  # fmt: skip


def first_token(base: str, served: str, timeout: float = 900) -> float:
    """Seconds until the first streamed token of a completion (the first SSE data event with a choice)."""
    t0 = time.perf_counter()
    body = {"model": served, "prompt": "Hello", "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=timeout) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and '"choices"' in line:
                return time.perf_counter() - t0
    raise RuntimeError(f"{served}: the stream ended without a token")


def spawn(engines: Children, setup: Setup, model: str, served: str) -> tuple[Child, str]:
    port = free_port()
    engine = engines.start(f"plain-{served}-{port}", setup.argv(model, served, port), setup.env)
    return engine, f"http://127.0.0.1:{port}"


# -- plain vLLM --------------------------------------------------------------------------------------
def plain(setup: Setup, a: str, b: str, repeat: int) -> dict[str, list[float]]:
    """The same moves by hand: B cold (nothing else running), then A started beside it; CPU: B's first token
    right after a request to A (both awake, as ours); GPU: B put to sleep first, then sleep one and wake
    the other by the raw endpoints."""
    out: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    with Children(setup.logs) as engines:
        engine_b, url_b = spawn(engines, setup, b, "b")
        engine_b.wait_http(f"{url_b}/health", 900, ok=lambda status: status == 200, interval=0.1)
        first_token(url_b, "b")
        out["cold"] = [time.perf_counter() - t0]
        if setup.gpu:  # two engines of 0.8 x the GPU do not fit awake together
            httpx.post(f"{url_b}/sleep", params={"level": "1"}, timeout=300).raise_for_status()
        engine_a, url_a = spawn(engines, setup, a, "a")
        engine_a.wait_http(f"{url_a}/health", 900, ok=lambda status: status == 200, interval=0.1)
        first_token(url_a, "a")
        if not setup.gpu:
            times = []
            for _ in range(repeat):
                first_token(url_a, "a")
                times.append(first_token(url_b, "b"))
            out["resident"] = times
            return out
        urls, names, times = [url_a, url_b], ["a", "b"], []
        for i in range(repeat * 2):  # A -> B, B -> A, ...
            cur, nxt = i % 2, (i + 1) % 2
            t = time.perf_counter()
            httpx.post(f"{urls[cur]}/sleep", params={"level": "1"}, timeout=300).raise_for_status()
            httpx.post(f"{urls[nxt]}/wake_up", timeout=300).raise_for_status()
            first_token(urls[nxt], names[nxt])
            times.append(time.perf_counter() - t)
        out["sleep"] = times
    return out


# -- ours ----------------------------------------------------------------------------------------------
class Ours:
    """The manager (and, through=gateway, the whole gateway) in a thread with its own event loop."""

    def __init__(self, setup: Setup, a: str, b: str, through: str) -> None:
        from stack.config.sections.manager import ManagerConfig
        from stack.engine.process import EngineSpec
        from stack.engine.runtime import LocalEngine, with_port
        from stack.manager.memory import NoProbe, NvmlProbe
        from stack.manager.policy import Capacity

        self.through = through
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        engines = []
        for model, served in ((a, "a"), (b, "b")):
            port = free_port()
            spec = EngineSpec(served, "bench", setup.argv(model, served, port), setup.env, "127.0.0.1", port,
                              setup.logs / f"ours-{served}.log", [])  # fmt: skip
            engines.append((served, spec, lambda s=spec: LocalEngine(with_port(s, free_port()))))
        # One model at a time at first (each needs 60% of the budget); `resident` widens the budget.
        settings = ManagerConfig(min_residency_s=0, quiet_s=0, idle_ttl_s=0, queue_timeout_s=900, restart_max=0)
        self.capacity = Capacity(10 * GIB, sleep_supported=setup.gpu)
        probe = NvmlProbe() if setup.gpu else NoProbe()
        if through == "gateway":
            self._gateway(engines, settings, probe)
        else:
            self._manager(engines, settings, probe)

    def _gateway(self, engines, settings, probe) -> None:
        import uvicorn

        from stack.assemble.runtimes import engine_supervisor
        from stack.config.sections.gateway import GatewayConfig
        from stack.gateway.app import create_app
        from stack.gateway.engines import ManagedEngine

        managed = [ManagedEngine(f(), n, n, factory=f, need=6 * GIB, can_sleep=self.capacity.sleep_supported,
                                 preload=n == "a") for n, _, f in engines]  # fmt: skip
        self.sup = engine_supervisor(managed, 900, 15, settings, self.capacity, probe)
        app = create_app(GatewayConfig(), default_model="a", on_startup=[self.sup.start], on_shutdown=[self.sup.stop],
                         environ={}, manager=self.sup.manager)  # fmt: skip
        port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        asyncio.run_coroutine_threadsafe(self.server.serve(), self.loop)
        while not self.server.started:
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port}"
        self.manager = app.state.gateway.manager
        self.state = app.state.gateway

    def _manager(self, engines, settings, probe) -> None:
        from stack.manager.manager import ModelManager
        from stack.manager.slot import Slot

        slots = [Slot(n, f(), f, 6 * GIB, "bench", self.capacity.sleep_supported) for n, _, f in engines]
        self.manager = ModelManager(slots, settings, self.capacity, probe=probe, startup_timeout_s=900,
                                    stop_grace_s=15)  # fmt: skip
        self.server = None

    def call(self, coro, timeout: float = 1800):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def ready(self, name: str) -> None:
        self.call(self.manager.load(name))

    def request(self, name: str) -> float:
        """A request for `name`, timed from send to first token (the manager switches as needed)."""
        if self.through == "gateway":
            return first_token(self.url, name)
        t0 = time.perf_counter()

        async def admit():
            return await self.manager.admit(name)

        ticket = self.call(admit())
        try:
            first_token(self.manager.slots[name].runtime.spec.base_url, name)
        finally:
            self.loop.call_soon_threadsafe(ticket.release)
        return time.perf_counter() - t0

    def close(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
            time.sleep(1)
            self.call(self.sup.stop(self.state))  # no-op if the server's shutdown already ran
        else:
            self.call(self.manager.shutdown())


def ours(setup: Setup, a: str, b: str, repeat: int, through: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    o = Ours(setup, a, b, through)
    try:
        o.ready("a")
        o.request("a")
        out["cold"] = [o.request("b")]  # A is stopped (CPU) or put to sleep (GPU), B cold-starts
        if setup.gpu:  # A asleep, B awake: alternate, each switch sleeps one and wakes the other
            out["sleep"] = [o.request("a" if i % 2 == 0 else "b") for i in range(repeat * 2)]
        o.manager.capacity = type(o.capacity)(100 * GIB, setup.gpu)  # now both fit: co-resident
        if not setup.gpu:
            o.ready("a")
            times = []
            for _ in range(repeat):
                o.request("a")
                times.append(o.request("b"))  # B resident, A was the active one
            out["resident"] = times
        out["decisions"] = o.manager.decisions  # type: ignore[assignment]
    finally:
        o.close()
    return out


def median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if s else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-a", help="CPU: model A (a folder or a Hub id)")
    ap.add_argument("--model-b", help="CPU: model B")
    ap.add_argument("--gpu", action="store_true", help="the GPU benchmark (bench/switch_gpu.py): dummy models of real "
                    "shapes, sleep mode, ours vs raw vLLM vs the bus")  # fmt: skip
    ap.add_argument("--scenario", choices=["pair", "round", "trio"], default="pair",
                    help="--gpu: 8B<->3B, 4 models, or the pair and a 7B at 0.9 (kept weights released)")
    ap.add_argument("--utilization", type=float, default=0.7, help="--gpu: each engine's gpu_memory_utilization")
    ap.add_argument("--launcher", default=None, help="how to run vLLM (default: the stack's launcher on CPU, "
                    "python3 -m vllm.entrypoints.cli.main on GPU)")  # fmt: skip
    ap.add_argument("--engine-args", default="--enforce-eager --max-model-len 512 --max-num-seqs 8 --dtype float32")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the engines")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sides", default=None, help="--gpu: ours,raw (default both; one side per call where the "
                    "starts of both do not fit one device call, e.g. round); handoff: the stack's default, sequential "
                    "switches with the memory handoff (manager.sleep_handoff); handoff-overlap: overlapped (the "
                    "default); handoff-warm: that on engines warmed after their start (manager.warm_handoff); ours: "
                    "without it")  # fmt: skip
    ap.add_argument("--through", choices=["gateway", "manager", "auto"], default="auto")
    ap.add_argument("--logs", type=Path, default=Path("/tmp/vstack-switch-bench"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.gpu:
        from bench import switch_gpu

        args.launcher = args.launcher or f"{sys.executable} -m vllm.entrypoints.cli.main"
        switch_gpu.main(args)
        return
    if not (args.model_a and args.model_b):
        ap.error("--model-a and --model-b are needed (or --gpu)")
    args.launcher = args.launcher or f"{sys.executable} -m stack.entrypoints.run stack.vllm.launcher"
    through = args.through
    if through == "auto":
        try:
            import litellm  # noqa: F401

            through = "gateway"
        except ImportError:
            through = "manager"
    env = dict(kv.split("=", 1) for kv in args.env)
    extra = shlex.split(args.engine_args)
    if args.gpu:
        env["VLLM_SERVER_DEV_MODE"] = "1"
        extra.append("--enable-sleep-mode")
    else:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    args.logs.mkdir(parents=True, exist_ok=True)
    setup = Setup(shlex.split(args.launcher), extra, env, args.logs, args.gpu)
    started = time.strftime("%Y-%m-%d %H:%M")
    p = plain(setup, args.model_a, args.model_b, args.repeat)
    print("plain vLLM:", {k: [round(x, 3) for x in v] for k, v in p.items()}, flush=True)
    o = ours(setup, args.model_a, args.model_b, args.repeat, through)
    decisions = o.pop("decisions", [])
    print("vstack:", {k: [round(x, 3) for x in v] for k, v in o.items()}, flush=True)
    rows = []
    for kind in ("resident", "sleep", "cold"):
        if kind in o and kind in p:
            rows.append({"kind": kind, "vstack_s": round(median(o[kind]), 3), "plain_vllm_s": round(median(p[kind]), 3),
                         "ratio": round(median(o[kind]) / median(p[kind]), 3), "runs": len(o[kind])})  # fmt: skip
    result = {"date": started, "machine": machine(), "through": through, "launcher": args.launcher,
              "engine_args": extra, "models": [args.model_a, args.model_b], "rows": rows,
              "raw": {"vstack": o, "plain": p}, "decisions": decisions}  # fmt: skip
    print(json.dumps(rows, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    else:
        summary = (
            "; ".join(
                f"{r['kind']}: vstack {r['vstack_s']:.2f} s vs plain vLLM {r['plain_vllm_s']:.2f} s" for r in rows
            )
            or "no row measured"
        )
        name = "switch-time" if args.repeat > 1 else "switch-time-quick"  # one run of each kind: its own series
        print("wrote", record(name, f"CPU switch times through the {through}: {summary}", figures(rows), raw=result))


def figures(rows: list[dict]) -> list[Figure]:
    """What the manifest and docs/performance.md show of a run."""
    out = []
    for r in rows:
        out.append(
            Figure(
                name=f"{r['kind']} switch, vstack",
                value=r["vstack_s"],
                unit="s",
                meaning=f"request to first token when the other model is {r['kind']}, through vstack "
                f"(median of {r['runs']}); lower is better",
            )
        )
        out.append(
            Figure(
                name=f"{r['kind']} switch, plain vLLM",
                value=r["plain_vllm_s"],
                unit="s",
                meaning="the same moves done by hand on plain vLLM",
            )
        )
    return out


def machine() -> str:
    desc = f"{platform.node()} {os.cpu_count()} cores"
    with contextlib.suppress(Exception):
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.strip()  # fmt: skip
        if out:
            desc += f", {out.splitlines()[0]} x{len(out.splitlines())}"
    return desc


if __name__ == "__main__":
    main()
