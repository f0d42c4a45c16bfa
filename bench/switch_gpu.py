"""`bench/switch_time.py --gpu`: sleeping switches on one GPU, ours next to raw vLLM and the bus limit, one run.

Ours (`--sides handoff`: the stack's default, the sleeping engine's GPU memory handed to the waking one; `ours`:
the same without the handoff): the model manager starts each model once and switches (tiers, overlapped wake,
NVML checks; once with the overlap and once with it off) on engines started as `vstack up` starts them: the
ledger's runtime patches on (gpu-sleep-wake-at-bus-speed) and the weights' host copy kept
(stack.engine.sleep_copy). The same engines are then switched by hand with vLLM's endpoints (raw-patched: POST
A/sleep?level=1, POST B/wake_up, first token), which separates the patch's share from the manager's. Raw vLLM:
after ours are gone, the same models on unpatched engines (VSTACK_RUNTIME_PATCHES=0), switched by hand the same
way. Before any engine starts, a pinned torch copy measures the bus (host->GPU, GPU->host, both at once): the
bus limit of a switch is its weights over those.

    scenario pair   8B -> 3B -> 8B ... (Llama-3.1-8B and Llama-3.2-3B shapes), `--repeat` times each way
    scenario round  4 models of 3B-8B shapes asked in turn (8B, 3B, Qwen2.5-7B, Mistral-7B), `--repeat` rounds;
                    `--sides ours` and `--sides raw` in two device calls (8 starts do not fit one)

Per switch it records: total (request to first token), the manager's phases (sleep, wake of the weights, of
the KV cache, ready), its own overhead (switch time not in a phase), and for raw vLLM sleep, wake, first token.
The engines' logs carry the patch's own `vstack sleep:` / `vstack wake` lines (copied, reused, unmap, maps).
Dummy weights (`--load-format dummy`) of the real shapes: real memory, real copies. GPU only. A level-2
switch cannot be measured on dummy weights (vLLM refuses `reload_weights` for them).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx

from bench.harness.switch_summary import SIDES, median, spread, summarize  # noqa: F401 (the bench's summary)
from bench.harness.waiting import free_port

ROOT = Path(__file__).resolve().parents[1]
GIB = 1024**3

# Llama-3.2-3B's published shape, on the Llama-3.1-8B config the planner ships (no 3B config is shipped).
LLAMA_3B = {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24,
            "num_key_value_heads": 8, "tie_word_embeddings": True, "head_dim": 128}  # fmt: skip
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-8b": ("meta-llama--Llama-3.1-8B-Instruct", {}),
    "llama-3b": ("meta-llama--Llama-3.1-8B-Instruct", LLAMA_3B),
    "qwen-7b": ("Qwen--Qwen2.5-7B-Instruct", {}),
    "mistral-7b": ("mistralai--Mistral-7B-v0.1", {}),
}
SCENARIOS = {"pair": ["llama-8b", "llama-3b"], "round": ["llama-8b", "llama-3b", "qwen-7b", "mistral-7b"],
             "trio": ["llama-8b", "llama-3b", "qwen-7b"]}  # fmt: skip
# trio: the pair at the scenario's utilization and a 7B at 0.9, asked in turn. With the weights kept (adr/0058) the
# 7B's 126 GiB of an H200 do not fit beside the 8B's kept weights and the 3B's residue: each of its starts and wakes
# has the 8B's kept weights released (Evict.RELEASE), which the pair and the 4-model round never need.
UTILIZATION_OF = {"trio": {"qwen-7b": 0.9}}

# One client for every timed call, made before any clock starts: `httpx.post()` and `httpx.stream()` build a
# client per call, SSL context included (27 ms each on a 2-core VM), which every first token and every raw
# sleep / wake call measured until 2026-11-29. No keep-alive: each call opens its own connection, as before.
HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))

BUS_CODE = r"""
import json, sys, time, torch
n = int(float(sys.argv[1]) * 2**30)
h, h2 = (torch.empty(n, dtype=torch.uint8, pin_memory=True) for _ in range(2))
d, d2 = (torch.empty(n, dtype=torch.uint8, device="cuda") for _ in range(2))
def best(fn, reps=4):
    out = 1e9
    for _ in range(reps):
        torch.cuda.synchronize(); t = time.perf_counter(); fn(); torch.cuda.synchronize()
        out = min(out, time.perf_counter() - t)
    return out
s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
def duplex():
    with torch.cuda.stream(s1): d.copy_(h, non_blocking=True)
    with torch.cuda.stream(s2): h2.copy_(d2, non_blocking=True)
h2d = best(lambda: d.copy_(h, non_blocking=True)); d2h = best(lambda: h.copy_(d, non_blocking=True))
both = best(duplex)
p = torch.empty(n, dtype=torch.uint8)
pageable = best(lambda: d.copy_(p), reps=2)
print(json.dumps({"gib": n / 2**30, "h2d_gbps": round(n / h2d / 1e9, 2), "d2h_gbps": round(n / d2h / 1e9, 2),
                  "duplex_each_gbps": round(n / both / 1e9, 2), "pageable_h2d_gbps": round(n / pageable / 1e9, 2)}))
"""


def bus(gib: float = 4.0) -> dict[str, float]:
    """Pinned host<->GPU copies measured by torch in a child process (its CUDA context is gone after)."""
    out = subprocess.run([sys.executable, "-c", BUS_CODE, str(gib)], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        return {"error": out.stderr[-2000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def bus_limit(w_out: int, w_in: int, b: dict[str, float]) -> dict[str, float | None]:
    """Seconds the bus needs to move A's weights out and B's in: one after the other, and both at once."""
    if "h2d_gbps" not in b:
        return {"sequential_s": None, "overlapped_s": None, "in_only_s": None}
    seq = w_out / (b["d2h_gbps"] * 1e9) + w_in / (b["h2d_gbps"] * 1e9)
    both = max(w_out, w_in) / (b["duplex_each_gbps"] * 1e9)
    # What actually crosses when the sleeping engine keeps its weights' host copy (the stack's default where
    # weights cannot change): only B's weights, host->GPU. Shown beside the goal's base, not instead of it.
    in_only = w_in / (b["h2d_gbps"] * 1e9)
    return {"sequential_s": round(seq, 3), "overlapped_s": round(both, 3), "in_only_s": round(in_only, 3)}


def make_models(names: list[str], where: Path) -> dict[str, Path]:
    from bench.harness.dummy_models import fixture_config, write_model

    out = {}
    for name in names:
        fixture, changes = SHAPES[name]
        out[name] = write_model(where / name, {**fixture_config(fixture), **changes})
    return out


def cuda_graphs() -> bool:
    """VSTACK_SWITCH_CUDA_GRAPHS=1: the engines with CUDA graphs, as the GPU profiles serve (default: eager)."""
    return os.environ.get("VSTACK_SWITCH_CUDA_GRAPHS", "0") == "1"


def first_token(base: str, served: str, timeout: float = 600) -> float:
    t0 = time.perf_counter()
    body = {"model": served, "prompt": "t5 t6 t7", "max_tokens": 4, "stream": True, "ignore_eos": True}
    with HTTP.stream("POST", f"{base}/v1/completions", json=body, timeout=timeout) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and '"choices"' in line:
                return time.perf_counter() - t0
    raise RuntimeError(f"{served}: no token")


class Bench:
    """The manager in a thread with its own loop, over LocalEngines it starts (sleep mode on)."""

    def __init__(self, models: dict[str, Path], utilization: dict[str, float], max_len: int, logs: Path,
                 launcher: list[str], patched: bool = True, handoff: bool = False, warm: bool = False,
                 keep: bool = False) -> None:  # fmt: skip
        import psutil

        from stack.config import load_config
        from stack.config.sections.manager import ManagerConfig
        from stack.engine.process import EngineSpec
        from stack.engine.runtime import LocalEngine, with_port
        from stack.engine.sleep_copy import sleep_copy_env
        from stack.hardware import detect, match_profile
        from stack.manager.manager import ModelManager
        from stack.manager.memory import NvmlProbe, capacity_bytes, host_budget_bytes
        from stack.manager.policy import Capacity
        from stack.manager.slot import Slot
        from stack.planner.fit_planner import fit_model

        cfg, info = load_config(), detect()
        hw, _why = match_profile(info, cfg)
        # One GPU's memory, as `vstack up` budgets it: both engines run on the first GPU (on the lent x2 the sum of
        # two let the 3B start beside the awake 8B, and vLLM refused it: 2026-11-29).
        self.total = capacity_bytes(ManagerConfig(), info)
        # Eager by default (short starts); VSTACK_SWITCH_CUDA_GRAPHS=1 runs the engines as the GPU profiles do, with
        # CUDA graphs: an eager first forward of an 8B takes 0.06-0.10 s awake (issue 58's probe), a floor under
        # every switch that the profiles' engines do not have.
        self.cuda_graphs = cuda_graphs()
        engine = {"enforce_eager": not self.cuda_graphs, "max_model_len": max_len}
        self.plans = {n: fit_model(cfg, str(p), hw.name, engine={**engine, "gpu_memory_utilization": utilization[n]})
                      for n, p in models.items()}  # fmt: skip
        # warm: manager.warm_handoff (issue 58, adr/0053), each started engine slept and woken once after staging.
        # keep: manager.sleep_keeps_weights (adr/0058, the default since 2026-11-30), from the engines' start on;
        # off for every other side, which measure the switches that copy weights.
        self.settings = ManagerConfig(min_residency_s=0, quiet_s=0, idle_ttl_s=0, queue_timeout_s=900,
                                      restart_max=0, warm_handoff=warm, sleep_keeps_weights=keep)  # fmt: skip
        # Ours: the ledger's runtime patches on and the host copy kept, as `vstack up` starts a GPU engine
        # (stack.engine.launch); raw vLLM: the same command with every runtime patch off.
        env = {"VLLM_SERVER_DEV_MODE": "1", **(sleep_copy_env({**engine, "enable_sleep_mode": True}) if patched
                                              else {"VSTACK_RUNTIME_PATCHES": "0"})}  # fmt: skip
        tag = ("handoff-warm-" if warm else "handoff-") if handoff else "" if patched else "raw-"
        # manager.sleep_handoff (on by default for one-GPU engines, adr/0016): a broker here, its socket in the
        # patched engines' environment, as stack.assemble.runtimes.handoff_broker does for `vstack up`.
        self.broker = None
        if handoff:
            from stack.vllm.plugins.handoff import SOCKET_ENV, HandoffBroker

            self.broker = HandoffBroker().start()
            env = {**env, SOCKET_ENV: self.broker.path}
        slots = []
        for name, folder in models.items():
            argv = [*launcher, "serve", str(folder), "--host", "127.0.0.1", "--port", "0", "--served-model-name",
                    name, "--load-format", "dummy", *([] if self.cuda_graphs else ["--enforce-eager"]),
                    "--max-model-len", str(max_len), "--gpu-memory-utilization", str(utilization[name]),
                    "--enable-sleep-mode"]  # fmt: skip
            spec = EngineSpec(name, "bench", argv, env, "127.0.0.1", 0, logs / f"{tag}{name}.log", [])
            factory = lambda s=spec: LocalEngine(with_port(s, free_port()))  # noqa: E731
            plan = self.plans[name]
            slots.append(Slot(name, factory(), factory, plan.budget.requested, "planner", True,
                              weights_gpu=plan.budget.weights, weights_host=plan.weights.total_bytes,
                              keeps_host_copy=bool(sleep_copy_env({**engine, "enable_sleep_mode": True}))
                              and patched))  # fmt: skip
        vm = psutil.virtual_memory()
        host = host_budget_bytes(self.settings, SimpleNamespace(ram_total=vm.total, ram_available=vm.available),
                                 len(slots))  # fmt: skip
        self.capacity = Capacity(self.total, True, host)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.manager = ModelManager(slots, self.settings, self.capacity, probe=NvmlProbe(), startup_timeout_s=900,
                                    stop_grace_s=15)  # fmt: skip
        self.manager.handoff = self.broker

    def call(self, coro, timeout: float = 1800):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def wait_staged(self, name: str, timeout: float = 120) -> float | None:
        """Seconds until the engine logged its `vstack stage:` line (host buffers ready for its first sleep),
        None if it did not within `timeout` (not a level-1 sleeper, or an engine without the patch)."""
        runtime = self.manager.slots[name].runtime
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            try:
                with open(runtime.spec.log_path, "rb") as f:
                    f.seek(getattr(runtime, "log_start", 0))
                    if b"vstack stage:" in f.read():
                        return round(time.monotonic() - started, 2)
            except OSError:
                pass
            time.sleep(0.2)
        return None

    def wait_warm(self, name: str, timeout: float = 120) -> float | None:
        """Seconds until the warm hand-over (manager.warm_handoff) of `name` ended, None if it did not."""
        slot, started = self.manager.slots[name], time.monotonic()
        while time.monotonic() - started < timeout:
            task = self.manager._warming.get(name)
            if task is not None and task.done():
                return round(time.monotonic() - started, 2) if not task.cancelled() and task.result() else None
            time.sleep(0.1)
        print(f"warm hand-over of {name} not done after {timeout:.0f} s ({slot.state}: {slot.detail})", flush=True)
        return None

    def url(self, name: str) -> str:
        return self.manager.slots[name].runtime.spec.base_url

    def request(self, name: str) -> dict[str, Any]:
        """A request for `name` through the manager's admission, to its first token; the switch it caused."""
        t0 = time.perf_counter()

        async def admit():
            return await self.manager.admit(name)

        ticket = self.call(admit())
        admitted = time.perf_counter() - t0
        try:
            first_token(self.url(name), name)
            total = time.perf_counter() - t0
            again = first_token(self.url(name), name)  # the same request, awake: what the first one paid for the wake
        finally:
            self.loop.call_soon_threadsafe(ticket.release)
        last = dict(self.manager.slots[name].last_switch)
        phases = last.get("phases", {})
        in_phases = sum(
            v
            for k, v in phases.items()
            if k.endswith("_s")
            and k != "overlap_s"
            and not (last.get("overlap") and (k.startswith("sleep_") or k in ("wake_weights_s", "reload_weights_s")))
        )
        in_phases += phases.get("overlap_s", 0.0)
        return {
            "to": name,
            "total_s": round(total, 3),
            "switch_s": last.get("seconds"),
            "kind": last.get("kind"),
            "tier": last.get("tier"),
            "overlap": last.get("overlap"),
            "order": last.get("order"),
            "phases": phases,
            "first_token_after_switch_s": round(total - admitted, 3),
            "first_token_again_s": round(again, 3),
            "overhead_s": None if last.get("seconds") is None else round(last["seconds"] - in_phases, 3),
        }

    def raw(self, frm: str, to: str, by_tag: bool = False) -> dict[str, Any]:
        """vLLM's own endpoints by hand: sleep the awake one (level 1), wake the other, its first token."""
        t0 = time.perf_counter()
        HTTP.post(f"{self.url(frm)}/sleep", params={"level": "1"}, timeout=300).raise_for_status()
        slept = time.perf_counter()
        out: dict[str, Any] = {"to": to, "from": frm, "sleep_s": round(slept - t0, 3)}
        if by_tag:
            HTTP.post(f"{self.url(to)}/wake_up", params={"tags": "weights"}, timeout=300).raise_for_status()
            mid = time.perf_counter()
            HTTP.post(f"{self.url(to)}/wake_up", params={"tags": "kv_cache"}, timeout=300).raise_for_status()
            out.update(wake_weights_s=round(mid - slept, 3), wake_kv_cache_s=round(time.perf_counter() - mid, 3))
        else:
            HTTP.post(f"{self.url(to)}/wake_up", timeout=300).raise_for_status()
        woke = time.perf_counter()
        out["wake_s"] = round(woke - slept, 3)
        settle = float(os.environ.get("VSTACK_SWITCH_SETTLE_S", "0") or 0)  # a pause before the first request
        if settle > 0:  # (issue 58 probe: is the first token's extra something the wake leaves running?)
            time.sleep(settle)
            out["settle_s"] = settle
        out["first_token_s"] = round(first_token(self.url(to), to), 3)
        out["total_s"] = round(time.perf_counter() - t0 - settle, 3)
        out["first_token_again_s"] = round(first_token(self.url(to), to), 3)  # awake: the wake's share is the gap
        return out

    def close(self) -> None:
        self.call(self.manager.shutdown())
        if self.broker is not None:
            self.broker.stop()


def _cycle(order: list[str], cur: str) -> list[str]:
    """Every model once, starting after `cur` and ending on it."""
    return [*order[order.index(cur) + 1 :], *order[: order.index(cur) + 1]]


def run(scenario: str, repeat: int, utilization: float, max_len: int, work: Path, launcher: list[str],
        sides: set[str] | None = None, save: Any = None) -> dict:  # fmt: skip
    """`sides`: "ours" (the manager on patched engines without the memory handoff, i.e. manager.sleep_handoff:
    false, and vLLM's endpoints by hand on those same engines: raw-patched), "handoff" (the manager with the
    handoff, what `vstack up` does by default for one-GPU engines since 2026-11-24, sequential switches:
    adr/0016), "handoff-overlap" (the same engines, the weights woken while the other sleeps: adr/0035; with
    "handoff" the two alternate round by round), "handoff-warm" (handoff-overlap on engines of their own, each
    slept and woken once after its start: manager.warm_handoff, adr/0053, issue 58's first switch),
    "handoff-spare" (the same, a switch's leftover kept for the next wake: manager.handoff_spare, adr/0057; with
    "handoff-warm" the two alternate round by round on one pair of engines), "handoff-kept" (the same engines
    after those rounds, each sleep keeping its weights mapped: manager.sleep_keeps_weights, adr/0058, the default
    since 2026-11-30; alone, on engines of their own that keep from their start) and "raw"
    (vLLM unpatched, its own engines started after ours are gone); ours and raw by default; handoff-warm runs
    last, so a run stopped at the device call's limit keeps the figures the README cites. `save(result)` after
    each side: a run stopped meanwhile still leaves its JSON."""
    sides = sides or {"ours", "raw"}
    names = SCENARIOS[scenario]
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    measured_bus = bus()
    print("bus:", measured_bus, flush=True)
    models = make_models(names, work / "models")
    util = {n: UTILIZATION_OF.get(scenario, {}).get(n, utilization) for n in names}
    result: dict[str, Any] = {"scenario": scenario, "utilization": utilization, "bus": measured_bus,
                              "utilization_of": util, "cuda_graphs": cuda_graphs(),
                              "sides": sorted(sides), "models": {}, "starts": [], "switches": []}  # fmt: skip
    order = names if scenario in ("round", "trio") else [names[0], names[1]]
    weights: dict[str, int] = {}

    def record(step: dict[str, Any], frm: str, to: str) -> None:
        step["bus"] = bus_limit(weights[frm], weights[to], measured_bus)
        result["switches"].append(step)
        print(json.dumps(step), flush=True)

    def start_all(b: Bench, label: str) -> str:
        result["host_budget_gib"] = round((b.capacity.host_budget or 0) / GIB, 1)
        result["gpu_total_gib"] = round(b.total / GIB, 2)
        for n in names:
            s = b.manager.slots[n]
            weights[n] = s.weights_gpu or 0
            result["models"][n] = {"weights_gib": round(weights[n] / GIB, 2), "need_gib": round(s.need / GIB, 2),
                                   "tier": str(s.tier), "tier_reason": s.tier_reason}  # fmt: skip
        for n in names:  # each started once (the one before it put to sleep)
            step = {"side": label, **b.request(n)}
            # The manager stages the host buffers of a level-1 sleeper once it is ready (issue 37): wait for
            # that before the next request puts it to sleep, as an engine serving a while first would have.
            step["staged_after_s"] = b.wait_staged(n) if label != "raw" else None
            if b.settings.warm_handoff:  # its sleep and wake after staging, before the next start puts it to sleep
                step["warmed_after_s"] = b.wait_warm(n)
            result["starts"].append(step)
            print("start", json.dumps(step), flush=True)
        return names[-1]

    try:
        if "ours" in sides:
            b = Bench(models, util, max_len, logs, launcher, patched=True)
            try:
                cur = start_all(b, "vstack")
                for r in range(repeat):
                    for overlap in (True, False):  # the manager with the overlapped wake, then sequential
                        b.manager.settings = b.settings.model_copy(update={"overlap_wake": overlap})
                        for n in _cycle(order, cur):
                            side = "vstack" if overlap else "vstack-sequential"
                            record({"side": side, "round": r, "from": cur, **b.request(n)}, cur, n)
                            cur = n
                    for n in _cycle(order, cur):  # vLLM's endpoints by hand on the patched engines, one wake call
                        record({"side": "raw-patched", "round": r, **b.raw(cur, n)}, cur, n)
                        cur = n
            finally:
                b.close()
        modes = [m for m in ("handoff", "handoff-overlap") if m in sides]
        if modes:  # the memory handed over (manager.sleep_handoff): sequential, and overlapped (adr/0035)
            b = Bench(models, util, max_len, logs, launcher, patched=True, handoff=True)
            try:
                cur = start_all(b, "vstack-handoff")
                for r in range(repeat):
                    for mode in modes:  # interleaved round by round on the same engines
                        b.manager.settings = b.settings.model_copy(update={"overlap_wake": mode != "handoff"})
                        for n in _cycle(order, cur):
                            record({"side": f"vstack-{mode}", "round": r, "from": cur, **b.request(n)}, cur, n)
                            cur = n
            finally:
                b.close()
        if save is not None and result["switches"]:
            save(result)
        if "raw" in sides:
            b = Bench(models, util, max_len, logs, launcher, patched=False)
            try:
                cur = start_all(b, "raw")
                for r in range(repeat):
                    for n in _cycle(order, cur):
                        record({"side": "raw", "round": r, **b.raw(cur, n, by_tag=r == 0)}, cur, n)
                        cur = n
            finally:
                b.close()
        if save is not None:
            save(result)
        # The default switch on engines warmed after their start (adr/0053), engines of their own; with
        # "handoff-spare" (manager.handoff_spare, adr/0057) on the same engines, the two alternating round by round.
        # "handoff-kept" (manager.sleep_keeps_weights, adr/0058) runs after them on the same engines, its own
        # rounds: a model that kept its weights would make the next round's first wake of another side cheap.
        warm_modes = [m for m in ("handoff-warm", "handoff-spare") if m in sides]
        if warm_modes or "handoff-kept" in sides:
            # handoff-kept alone: the stack's default since 2026-11-30, engines kept from their start on, so its
            # first switch after the start is the one a user gets.
            b = Bench(models, util, max_len, logs, launcher, patched=True, handoff=True, warm=True,
                      keep=not warm_modes)  # fmt: skip
            try:
                cur = start_all(b, f"vstack-{(warm_modes or ['handoff-kept'])[0]}")
                for r in range(repeat):
                    for mode in warm_modes:
                        spare = mode == "handoff-spare"
                        if not spare and b.broker is not None:
                            b.broker.drop_spare()  # a round without it starts as the default does: nothing kept
                        b.manager.settings = b.manager.settings.model_copy(update={"handoff_spare": spare})
                        for n in _cycle(order, cur):
                            record({"side": f"vstack-{mode}", "round": r, "from": cur, **b.request(n)}, cur, n)
                            cur = n
                if "handoff-kept" in sides:
                    if b.broker is not None:
                        b.broker.drop_spare()
                    b.manager.settings = b.manager.settings.model_copy(update={"handoff_spare": False,
                                                                               "sleep_keeps_weights": True})
                    for r in range(repeat):  # after other sides, round 0 wakes a model slept without keeping
                        for n in _cycle(order, cur):
                            record({"side": "vstack-handoff-kept", "round": r, "from": cur, **b.request(n)}, cur, n)
                            cur = n
            finally:
                b.close()
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        print("error:", result["error"], flush=True)
    result["summary"] = summarize(result)
    return result


def main(args: Any) -> None:
    import shlex

    work = Path(args.logs)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sides = set(args.sides.split(",")) if args.sides else None

    def save(partial: dict) -> None:  # after each side: what a run stopped at the device call's limit leaves
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({**partial, "summary": summarize(partial), "partial": True}, indent=1))

    result = run(args.scenario, args.repeat, args.utilization, 2048, work, shlex.split(args.launcher), sides, save)
    result["date"] = time.strftime("%Y-%m-%d %H:%M")
    print(json.dumps(result["summary"], indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    from bench.harness.switch_summary import table

    # Last, once the result is written: what a newcomer reads (medians, spread, ratios; docs/guides/switching.md).
    print("\n" + table(result), flush=True)
