"""Measure an engine with vLLM's own `vllm bench serve`, shaped by a scenario, as the summary metrics.

The random dataset gives prompts of exact token counts (the scenario's mean, spread as vLLM's range
ratio), `--ignore-eos` fixes the output length, and `--max-concurrency` / `--request-rate` the load. It
talks to the completions endpoint (vLLM's default backend), so no chat template changes the counts; that is
also how the reference figures in ../shared/gpu were taken.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stack.config.slo import LATENCIES, PERCENTILES
from stack.engine_env import child_argv, engine_python_env
from stack.errors import ExitCode, StackError
from stack.load import bench_worker
from stack.load.scenario import Scenario
from stack.vllm import launcher


class BenchError(StackError):
    exit_code = ExitCode.BENCH


@dataclass(frozen=True)
class OpenLoop:
    """One open-loop probe: arrivals at `rate` (inf: all at t=0), no cap on requests in flight."""

    rate: float
    num_prompts: int
    burstiness: float = 1.0
    warmups: int = 0
    seed: int = 0


def bench_command(scenario: Scenario, python: str, base_url: str, model: str, tokenizer: str,
                  result_dir: Path, result_file: str, open_loop: OpenLoop | None = None) -> list[str]:
    """Closed loop (capacity mode: the scenario's users as --max-concurrency), or one open-loop probe."""
    args = bench_args(scenario, base_url, model, tokenizer, result_dir, result_file, open_loop)
    return [*_bench_serve(python), *args]


def _bench_serve(python: str) -> list[str]:
    return child_argv(python, launcher, "bench", "serve")


def bench_args(scenario: Scenario, base_url: str, model: str, tokenizer: str, result_dir: Path, result_file: str,
               open_loop: OpenLoop | None = None) -> list[str]:
    """What follows `vllm bench serve`."""
    req, load = scenario.requests, scenario.load
    cmd = [
        "--base-url", base_url, "--model", model, "--tokenizer", tokenizer,
        "--dataset-name", "random",
        "--random-input-len", str(req.prompt_tokens.center),
        "--random-output-len", str(req.output_tokens.center),
        "--random-range-ratio", f"{max(req.prompt_tokens.spread, req.output_tokens.spread):.3f}",
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", ",".join(str(p) for p in PERCENTILES),
        "--save-result", "--result-dir", str(result_dir), "--result-filename", result_file,
        "--disable-tqdm",
    ]
    if open_loop is not None:
        cmd += ["--num-prompts", str(open_loop.num_prompts), "--request-rate", f"{open_loop.rate:g}",
                "--burstiness", f"{open_loop.burstiness:g}", "--seed", str(open_loop.seed)]
        if open_loop.warmups:
            cmd += ["--num-warmups", str(open_loop.warmups)]
    else:
        cmd += ["--num-prompts", str(scenario.num_prompts()), "--max-concurrency", str(load.peak_users)]
        if load.rate:
            cmd += ["--request-rate", f"{load.rate:g}"]
        if scenario.tune.warmups:
            cmd += ["--num-warmups", str(scenario.tune.warmups)]  # capacity: counted only when asked
    if req.shared_prefix_tokens:
        cmd += ["--random-prefix-len", str(req.shared_prefix_tokens)]
    if req.ignore_eos:
        cmd.append("--ignore-eos")
    return cmd


def metrics_from_bench(result: dict[str, Any]) -> dict[str, float | None]:
    """vllm bench serve's result JSON -> our metric names (e2el -> e2e, throughputs renamed)."""
    completed = result.get("completed") or 0
    failed = result.get("failed")
    if failed is None:
        failed = max(0, (result.get("num_prompts") or completed) - completed)
    total = completed + failed
    out: dict[str, float | None] = {
        "requests": total, "ok": completed, "errors": failed,
        "error_rate": failed / total if total else None,
        "duration_s": result.get("duration"),
        "requests_per_s": result.get("request_throughput"),
        "output_tokens_per_s": result.get("output_throughput"),
        "total_tokens_per_s": result.get("total_token_throughput"),
        "prompt_tokens_mean": (result.get("total_input_tokens") or 0) / completed if completed else None,
        "output_tokens_mean": (result.get("total_output_tokens") or 0) / completed if completed else None,
    }
    for name in LATENCIES:
        theirs = "e2el" if name == "e2e" else name
        out[f"mean_{name}_ms"] = result.get(f"mean_{theirs}_ms")
        for p in PERCENTILES:
            out[f"p{p}_{name}_ms"] = result.get(f"p{p}_{theirs}_ms")
    return out


class BenchWorker:
    """One `vllm bench serve` process for many runs (stack.load.bench_worker): vLLM is imported once.

    Started at once, so its import overlaps the first engine's start. A run past its time limit kills it; the
    next run starts a new one. `close()` ends it (its stdin closed, then its process group killed)."""

    def __init__(self, python: str, log: Path) -> None:
        self.python = python
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready: dict[str, Any] | None = None
        self._buffer = b""
        self.start()

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(child_argv(self.python, bench_worker), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, start_new_session=True,
                                         env=engine_python_env(keep_secrets=True, PYTHONUNBUFFERED="1"))
        self.ready, self._buffer = None, b""

    def _reply(self, deadline: float, on_tick: Callable[[float], None], started: float, what: str
               ) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            if time.monotonic() > deadline:
                self.kill()
                raise BenchError(f"{what} ran past its time limit", hint=f"read {self.log}")
            readable, _, _ = select.select([fd], [], [], 0.5)
            if readable:
                chunk = os.read(fd, 65536)
                if not chunk:  # the worker ended: say why from its own log
                    self.kill()
                    tail = self.log.read_text(errors="replace")[-1500:] if self.log.is_file() else ""
                    raise BenchError(f"the vllm bench serve worker ended during {what}:\n{tail}",
                                     hint=f"read {self.log}")
                self._buffer += chunk
            on_tick(time.monotonic() - started)
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def run(self, argv: list[str], log: Path, timeout_s: float, on_tick: Callable[[float], None]) -> None:
        """One `vllm bench serve ARGV`, its output appended to LOG; raises BenchError when it fails."""
        started = time.monotonic()
        deadline = started + timeout_s
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        if self.ready is None:
            self.ready = self._reply(deadline, on_tick, started, "the worker's start (importing vLLM)")
            if not self.ready.get("ready"):
                raise BenchError(f"the vllm bench serve worker could not start: {self.ready.get('error')}",
                                 hint=f"read {self.log}")
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps({"argv": argv, "log": str(log)}) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.kill()
            raise BenchError("the vllm bench serve worker ended before a run", hint=f"read {self.log}") from None
        answer = self._reply(deadline, on_tick, started, "vllm bench serve")
        if not answer.get("ok"):
            tail = log.read_text(errors="replace")[-1500:] if log.is_file() else ""
            raise BenchError(f"vllm bench serve failed ({answer.get('error')}):\n{tail}", hint=f"read {log}")

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
        self.proc = None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()  # end of requests: it leaves its loop
                self.proc.wait(timeout=10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def __enter__(self) -> BenchWorker:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def run_bench(scenario: Scenario, python: str, base_url: str, model: str, tokenizer: str, work_dir: Path,
              name: str, on_tick: Callable[[float], None] = lambda _: None, timeout_s: float = 3600,
              open_loop: OpenLoop | None = None, worker: BenchWorker | None = None
              ) -> tuple[dict[str, float | None], Path]:
    """Run it to the end; returns (metrics, path of vLLM's result JSON). Its output goes to NAME.bench.log.
    With a worker, the run happens there instead of in a new process (same command, same figures)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    result_file = f"{name}.bench.json"
    (work_dir / result_file).unlink(missing_ok=True)
    log = work_dir / f"{name}.bench.log"
    args = bench_args(scenario, base_url, model, tokenizer, work_dir, result_file, open_loop)
    cmd = [*_bench_serve(python), *args]
    path = work_dir / result_file
    if worker is not None:
        log.write_text(f"$ {' '.join(cmd)}\n(run in the bench worker, {worker.log})\n")
        worker.run(args, log, timeout_s, on_tick)
        if not path.is_file():
            raise BenchError(f"vllm bench serve wrote no result ({path})", hint=f"read {log}")
        return metrics_from_bench(json.loads(path.read_text())), path
    started = time.monotonic()
    with open(log, "wb") as log_file:
        log_file.write(("$ " + " ".join(cmd) + "\n").encode())
        log_file.flush()
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        try:
            while proc.poll() is None:
                elapsed = time.monotonic() - started
                if elapsed > timeout_s:
                    raise BenchError(f"vllm bench serve ran past {timeout_s:.0f} s", hint=f"read {log}")
                on_tick(elapsed)
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    if proc.returncode != 0 or not path.is_file():
        tail = log.read_text(errors="replace")[-1500:]
        raise BenchError(f"vllm bench serve failed (exit {proc.returncode}):\n{tail}", hint=f"read {log}")
    return metrics_from_bench(json.loads(path.read_text())), path


def open_loop_probe(scenario: Scenario, python: str, base_url: str, model: str, tokenizer: str, work_dir: Path,
                    name: str, burstiness: float = 1.0, warmups: int = 0,
                    on_tick: Callable[[float, str], None] = lambda *_: None, worker: BenchWorker | None = None,
                    timeout_s: float = 3600) -> Callable[[float, int, int], dict[str, float | None]]:
    """The probe a goodput search calls: (rate, requests, seed) -> vllm bench serve's figures in our names."""

    def probe(rate: float, n: int, seed: int) -> dict[str, float | None]:
        loop = OpenLoop(rate, n, burstiness, warmups, seed)
        metrics, _path = run_bench(scenario, python, base_url, model, tokenizer, work_dir, f"{name}-p{seed}",
                                   lambda t: on_tick(t, f"probe {seed}: {rate:g} req/s"), timeout_s=timeout_s,
                                   open_loop=loop, worker=worker)
        return metrics

    return probe
