"""`vllm bench serve` kept up between runs: vLLM's own benchmark, one run per request, in one process.

A goodput search runs five to seven probes per candidate. As separate `vllm bench serve` processes each
one paid vLLM's import again (13-17 s on the lent H200) for ~10 s of measurement: a third of a 6-candidate
tune. This process imports vLLM once and runs each request through the subcommand the CLI dispatches to
(`vllm.entrypoints.cli.benchmark.serve`: the same parser, the same `main`), its output into that run's log.
It runs in the engine's Python (like `stack.vllm.launcher`), so it needs nothing of the stack but this file
and the launcher's distribution alias.

    python -m stack.entrypoints.run stack.load.bench_worker
    stdin:  one JSON object per line: {"argv": [...what follows `vllm bench serve`...], "log": PATH}
    stdout: {"ready": true, "vllm": VERSION} once imported, then one {"ok": bool, "error": str} per run
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def _output_to(path: str) -> Iterator[None]:
    """Both standard streams into the run's log at the descriptor level (vLLM's log handlers and prints alike)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def _bench_serve() -> tuple[Callable[[list[str]], Any], Callable[[Any], None]]:
    """vLLM's `bench serve` subcommand: (parse argv, run parsed args)."""
    from vllm import platforms
    from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if platforms.current_platform.is_unspecified():  # as vLLM's CLI does for `vllm bench`
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    BenchmarkServingSubcommand.add_cli_args(parser)
    return parser.parse_args, BenchmarkServingSubcommand.cmd


def run_one(parse: Callable[[list[str]], Any], run: Callable[[Any], None], argv: list[str]) -> dict[str, Any]:
    """One benchmark run; every failure is a reply, never the end of the worker."""
    try:
        run(parse(argv))
    except SystemExit as exc:  # argparse's own error, or vLLM exiting on bad input
        if exc.code not in (0, None):
            return {"ok": False, "error": f"vllm bench serve exited with {exc.code}"}
    except Exception as exc:  # any failure of a run is reported with its log; the worker goes on
        traceback.print_exc()
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
    return {"ok": True}


def main() -> int:
    from stack.vllm.launcher import alias_distribution, installed_vllm

    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints between runs go to the worker's own log, never into the replies

    def reply(obj: dict[str, Any]) -> None:
        replies.write(json.dumps(obj) + "\n")

    alias_distribution()
    found = installed_vllm()
    if found is None:
        reply({"ready": False, "error": f"vllm is not installed in {sys.executable}"})
        return 3
    parse, run = _bench_serve()
    reply({"ready": True, "vllm": found[1], "pid": os.getpid()})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            with _output_to(request["log"]):
                result = run_one(parse, run, list(request["argv"]))
        except (ValueError, KeyError, TypeError, OSError) as exc:  # a bad request or an unwritable log: said, not fatal
            result = {"ok": False, "error": f"bad request to the bench worker: {type(exc).__name__}: {exc}"}
        reply(result)
    return 0

