"""The sleep-switching row: two shipped models behind one gateway, switched by the model manager, next to
raw vLLM doing the same sleep + wake by hand, in the same run on the same GPU.

Ours: `vstack up A` with `manager.models: [A, B]` (sleep mode turns on by itself for two GPU models), each
engine at the hardware profile's utilization so that the two never fit awake together. A request for B
while A is active: the manager puts A to sleep and starts B (cold), B's first token; then A, B again:
each switch sleeps one engine and wakes the other. NVML shows the memory each engine process holds after
every switch (the sleeping one must have given its weights and KV cache back).

Raw: the same two folders served by plain `vllm serve --enable-sleep-mode`, B asleep, then POST A/sleep,
POST B/wake_up, B's first token; and back.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.gpu.device import Device
from bench.gpu.profiles import prepare, vstack
from bench.harness.children import Children
from bench.harness.waiting import free_port
from stack.manager.client import admin_headers

GIB = 1024**3
MODEL_A, MODEL_B = "llama-3.1-8b-instruct", "qwen2.5-7b-instruct"
# Short starts: no CUDA graphs, a 8k context. Sleep and wake move the same weights either way.
ENGINE = {"enforce_eager": True, "max_model_len": 8192}


def first_token(base: str, served: str, timeout: float = 600) -> float:
    """Seconds from sending a streamed chat to its first content chunk (the openai client)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=timeout, max_retries=0)
    t0 = time.perf_counter()
    for chunk in client.chat.completions.create(model=served, messages=[{"role": "user", "content": "t5 t6"}],
                                                max_tokens=4, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            return time.perf_counter() - t0
    raise RuntimeError(f"{served}: the stream ended without a token")


def per_process(device: Device) -> dict[int, float]:
    """GiB held on the GPUs by each process (NVML)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        held: dict[int, float] = {}
        for i in range(device.count):
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i)):
                held[p.pid] = round(held.get(p.pid, 0) + (p.usedGpuMemory or 0) / GIB, 2)
        return held
    finally:
        pynvml.nvmlShutdown()


def states(base: str, state_dir: Path) -> dict[str, str]:
    # the admin token `vstack up` wrote to the run's state_dir (no admin key here: adr/0039)
    models = httpx.get(f"{base}/admin/models", timeout=10, headers=admin_headers(base, state_dir)).json()["models"]
    return {m["model"]: m["state"] for m in models}


@contextlib.contextmanager
def served(run: Any, device: Device, log_dir: Path, tag: str, out: dict[str, Any]) -> Iterator[str | None]:
    """`vstack up` of the run's default model on a free port: its base URL, or None (out["error"] says why) when
    it did not come up; then `vstack down --all`, the GPUs' memory checked given back, the engines' log tails kept
    as `tag--NAME.log`. An exception inside is recorded in out["error"]."""
    baseline = device.used_bytes()
    port = free_port()
    t0 = time.perf_counter()
    try:
        up = vstack(run, "up", run.profile, "--port", str(port))
        out["a_started_s"] = round(time.perf_counter() - t0, 1)
        if up.returncode != 0:
            out["error"] = (up.stdout + up.stderr)[-3000:]
            yield None
        else:
            yield f"http://127.0.0.1:{port}"
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        vstack(run, "down", "--all", timeout=300)
        out["stopped_clean"], out["memory_after"] = device.wait_released(baseline)
        for log in (run.state_dir / "logs").glob("*.log"):
            (log_dir / f"{tag}--{log.name}").write_bytes(log.read_bytes()[-400_000:])


def ours(cfg: Any, device: Device, work: Path, log_dir: Path) -> dict[str, Any]:
    run = prepare(cfg, MODEL_A, device, work, extra_models=[MODEL_B], engine=ENGINE,
                  manager={"models": [MODEL_A, MODEL_B], "min_residency_s": 0, "quiet_s": 0,
                           "queue_timeout_s": 600})
    out: dict[str, Any] = {"steps": []}
    with served(run, device, log_dir, "switch", out) as base:
        if base is None:
            return out
        first_token(base, MODEL_A)
        plan = [(MODEL_B, "cold"), (MODEL_A, "wake"), (MODEL_B, "wake"), (MODEL_A, "wake")]
        for model, kind in plan:
            seconds = first_token(base, model)
            out["steps"].append({"to": model, "kind": kind, "first_token_s": round(seconds, 3),
                                 "states": states(base, run.state_dir), "gpu_gib_by_pid": per_process(device),
                                 "used_gib": [round(u / GIB, 2) for u in device.used_bytes()]})
    return out


def raw(device: Device, work: Path, log_dir: Path, utilization: float) -> dict[str, Any]:
    """Plain vLLM: B started and put to sleep, A started; then sleep one / wake the other by hand."""
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    engines = Children(log_dir)
    out: dict[str, Any] = {"steps": []}
    baseline = device.used_bytes()

    def start(name: str) -> str:
        port = free_port()
        argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(work / "models" / name),
                "--host", "127.0.0.1", "--port", str(port), "--served-model-name", name, "--load-format", "dummy",
                "--enable-sleep-mode", "--gpu-memory-utilization", str(utilization), "--enforce-eager",
                "--max-model-len", str(ENGINE["max_model_len"])]
        base = f"http://127.0.0.1:{port}"
        engines.start(f"raw-{name}", argv, env).wait_http(f"{base}/health", 600, ok=lambda status: status == 200,
                                                          interval=0.5)
        return base

    try:
        b = start(MODEL_B)
        first_token(b, MODEL_B)
        httpx.post(f"{b}/sleep", params={"level": "1"}, timeout=300).raise_for_status()
        a = start(MODEL_A)
        first_token(a, MODEL_A)
        urls = {MODEL_A: a, MODEL_B: b}
        for src, dst in ((MODEL_A, MODEL_B), (MODEL_B, MODEL_A), (MODEL_A, MODEL_B)):
            t = time.perf_counter()
            httpx.post(f"{urls[src]}/sleep", params={"level": "1"}, timeout=300).raise_for_status()
            slept = time.perf_counter() - t
            httpx.post(f"{urls[dst]}/wake_up", timeout=300).raise_for_status()
            seconds = first_token(urls[dst], dst)
            out["steps"].append({"to": dst, "kind": "wake", "sleep_s": round(slept, 3),
                                 "first_token_s": round(time.perf_counter() - t, 3),
                                 "gpu_gib_by_pid": per_process(device), "ttft_after_wake_s": round(seconds, 3)})
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        engines.stop_all()
        out["stopped_clean"], out["memory_after"] = device.wait_released(baseline)
    return out


def run_switching(cfg: Any, device: Device, work: Path, log_dir: Path) -> dict[str, Any]:
    row: dict[str, Any] = {"row": "sleep-switch", "kind": "switch", "models": [MODEL_A, MODEL_B]}
    hw = cfg.hardware[next(h for h in cfg.hardware.values() if h.accelerator == "gpu" and h.gpu_count == 1
                           and any(m.lower() in device.name.lower() for m in h.match)).name]
    utilization = float(hw.engine.get("gpu_memory_utilization") or 0.9)
    row["ours"] = ours(cfg, device, work, log_dir)
    row["raw"] = raw(device, work, log_dir, utilization)
    judge(row)
    return row


def judge(row: dict[str, Any]) -> None:
    """The switch worked: every step's target ready, the other asleep and holding little GPU memory."""
    ours_steps = row["ours"].get("steps", [])
    ok = len(ours_steps) == 4 and "error" not in row["ours"]
    freed = []
    for step in ours_steps:
        other = MODEL_A if step["to"] == MODEL_B else MODEL_B
        ok = ok and step["states"].get(step["to"]) == "ready" and step["states"].get(other) == "sleeping"
        held = sorted(step["gpu_gib_by_pid"].values())
        # one awake engine (most of the GPU) and one asleep (its CUDA context and little else)
        freed.append(held[0] if len(held) >= 2 else None)
    row["asleep_holds_gib"] = freed
    ok = ok and all(f is not None and f < 4 for f in freed)
    wakes = [s["first_token_s"] for s in ours_steps if s["kind"] == "wake"]
    raw_wakes = [s["first_token_s"] for s in row["raw"].get("steps", [])]
    row["switch_s"] = {"ours_cold": next((s["first_token_s"] for s in ours_steps if s["kind"] == "cold"), None),
                       "ours_wake_median": sorted(wakes)[len(wakes) // 2] if wakes else None,
                       "raw_wake_median": sorted(raw_wakes)[len(raw_wakes) // 2] if raw_wakes else None}
    row["ok"] = bool(ok and row["ours"].get("stopped_clean") and raw_wakes and "error" not in row["raw"])
