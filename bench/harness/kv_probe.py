"""vLLM's own memory figures for one model shape: start an engine with dummy weights, wait for its KV cache line
in the log (or its exit), stop it; what it logged. The planner's checks (bench/planner_check.py on the CPU build
and a GPU, the GPU suite's layout rows) compare the planner against these."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness.children import ROOT, Children
from bench.harness.waiting import free_port

CPU_KV_GIB = 1  # VLLM_CPU_KVCACHE_SPACE for every CPU shape: small, on a shared machine

PATTERNS = {
    "weights_gib": r"Model loading took ([\d.]+) ?GiB",
    "kv_gib": r"Available KV cache memory: ([\d.]+) GiB",
    "kv_tokens": r"KV cache size: ([\d,]+) tokens",
    "max_concurrency": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
    "torch_peak_gib": r"torch peak memory increase: ([\d.]+) ?GiB",
    "non_torch_gib": r"non-torch forward increase memory: ([\d.]+) ?GiB",
    "total_consumed_gib": r"total consumed \(from mem_get_info\): ([\d.]+) ?GiB",
    "cudagraph_util": r"--gpu-memory-utilization=([\d.]+) is equivalent to --gpu-memory-utilization=([\d.]+)",
}


def engine_argv(target: str, folder: Path, options: dict[str, Any]) -> list[str]:
    """`vllm serve` (GPU) or the stack's CPU launcher, dummy weights, a free port, `options` as flags."""
    if target == "gpu":
        base = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(folder)]
    elif (ROOT / "stack" / "entrypoints" / "run.py").is_file():
        base = [sys.executable, "-m", "stack.entrypoints.run", "stack.vllm.launcher", "serve", str(folder)]
    else:
        base = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    argv = [*base, "--load-format", "dummy", "--host", "127.0.0.1", "--port", str(free_port())]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def logged_figures(text: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, pattern in PATTERNS.items():
        m = re.search(pattern, text)
        if m and key == "cudagraph_util":
            found["cudagraph_util"] = [float(m.group(1)), float(m.group(2))]
        elif m:
            found[key] = float(m.group(1).replace(",", ""))
    return found


def run_engine(target: str, folder: Path, options: dict[str, Any], log: Path, timeout: float) -> dict[str, Any]:
    """Start vLLM, wait for its KV cache line (or its exit), stop it; the figures it logged, or `error` with
    the log's last lines."""
    env = {"VLLM_LOGGING_LEVEL": "DEBUG", "PYTHONUNBUFFERED": "1"}
    if target == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(CPU_KV_GIB)
        # Memory in the model's own dtype, which the planner models; answers are not read (adr/0012 guard).
        env["VSTACK_ALLOW_CPU_BF16"] = "1"
    start = time.monotonic()
    log.unlink(missing_ok=True)
    with Children(log.parent, grace=20) as children:
        engine = children.start(log.stem, engine_argv(target, folder, options), env, log=log)
        while time.monotonic() - start < timeout and engine.running():
            time.sleep(1)
            if re.search(PATTERNS["kv_tokens"], log.read_text(errors="replace")):
                time.sleep(1)  # let the concurrency line follow
                break
    text = log.read_text(errors="replace")
    found: dict[str, Any] = {"seconds": round(time.monotonic() - start, 1), **logged_figures(text)}
    if "kv_tokens" not in found:
        found["error"] = "\n".join(text.splitlines()[-15:])
    return found
