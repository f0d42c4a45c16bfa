"""One candidate measured: its engine started (or the one held at its device's door opened), its rate searched
(goodput) or its scenario run once (capacity), its answers kept for the quality guard, its engine stopped."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stack.config.schema import StackConfig
from stack.config.slo import Clause
from stack.engine.launch import engine_spec
from stack.engine.ports import free_port
from stack.engine.process import EngineProcess, EngineSpec
from stack.errors import StackError
from stack.load.scenario import Scenario
from stack.load.vllm_bench import BenchWorker
from stack.planner.plans import ModelPlan
from stack.tune.candidates import Candidate
from stack.tune.choose import Measured
from stack.tune.knobs import numerics_change
from stack.tune.prestart import Prestart
from stack.tune.quality_guard import answers_of
from stack.tune.rate_search import BudgetExhausted, Point, SearchSettings, answered_counts, search_goodput
from stack.tune.request import Mode, TuneRequest


def measure_candidate(
    cfg: StackConfig,
    req: TuneRequest,
    scenario: Scenario,
    scenario_path: Path,
    base: ModelPlan,
    plan: ModelPlan,
    cand: Candidate,
    clauses: list[Clause],
    mode: Mode,
    earlier: list[Point],
    deadline: float | None,
    tick: Callable[..., None],
    save: Callable[[Measured], None],
    worker: BenchWorker | None = None,
    pre: Prestart | None = None,
    on_ready: Callable[[float], None] = lambda _s: None,
) -> Measured:
    result = Measured(cand.key, cand.label, cand.overrides, numerics=numerics_change(cand.overrides))
    prestart_s: float | None = None
    if pre is not None and pre.alive():
        engine, prestart_s = pre.engine, pre.open()
    else:
        if pre is not None:  # it exited while held (its log says why): started again the usual way
            pre.discard(cfg.stop_grace_s)
        engine = candidate_engine(req, plan, cand)
    spec, log = engine.spec, engine.spec.log_path
    started = time.monotonic()
    try:
        if prestart_s is None:
            engine.start()
        tick("starting", 0.0)
        startup = engine.wait_ready(cfg.startup_timeout_s, lambda t, line: tick("starting", t, line[-80:]))
        on_ready(startup)
        common = {"startup_s": round(startup, 1), "command": plan.display(), "log": str(log)}
        if prestart_s is not None:  # the part of its start done while the previous candidate was measured
            common["prestart_s"] = round(prestart_s, 1)
        if mode == "goodput":
            metrics = _search(
                req, scenario, plan, spec, cand, clauses, earlier, deadline, tick, result, save, common, worker
            )
        else:
            metrics = answered(
                _run_measurement(req, scenario, scenario_path, plan, spec, lambda t: tick("measuring", t), worker)
            )
        if str(plan.engine.get("load_format") or "") != "dummy":
            got = answers_of(spec.base_url, plan.served_name)
            result.answers, result.answer_tokens = (got.texts, got.tokens) if got else (None, None)
        result.metrics = {**metrics, **common, "measured_s": round(time.monotonic() - started - startup, 1)}
    except BudgetExhausted as exc:
        result.paused = True
        result.points = [p.as_dict() for p in exc.points]
        result.error = f"paused by the time budget after {len(exc.points)} probe(s); the next call resumes"
    except StackError as exc:
        result.error = exc.message.splitlines()[0][:300]
    finally:
        engine.stop(cfg.stop_grace_s)
        if pre is not None:
            pre.cleanup()
    return result


def candidate_engine(req: TuneRequest, plan: ModelPlan, cand: Candidate) -> EngineProcess:
    """The candidate's engine, not started; its port picked now (the planning was minutes ago)."""
    log = req.out_dir / "logs" / f"{cand.key}.engine.log"
    log.unlink(missing_ok=True)
    # No key: the benchmark clients (vllm bench, Locust, the metrics reader) talk to this short-lived loopback
    # engine directly; it serves no one else and holds no secret of ours (stack.engine_env strips them).
    spec = engine_spec(plan, log, name=f"tune-{cand.key}", port=free_port(plan.host))
    spec.api_key = None
    return EngineProcess(spec)


def answered(metrics: dict[str, Any]) -> dict[str, Any]:
    """A capacity run none of whose requests was answered ends the candidate, as a probe does in the search."""
    answered_counts(metrics, "the capacity run", "read the candidate's *.bench.log and its engine log")
    return metrics


def _search(
    req: TuneRequest,
    scenario: Scenario,
    plan: ModelPlan,
    spec: EngineSpec,
    cand: Candidate,
    clauses: list[Clause],
    earlier: list[Point],
    deadline: float | None,
    tick: Callable[..., None],
    result: Measured,
    save: Callable[[Measured], None],
    common: dict[str, Any],
    worker: BenchWorker | None = None,
) -> dict[str, Any]:
    """The rate search on a started engine; every probe is saved at once (a killed call loses none)."""
    from stack.load.vllm_bench import open_loop_probe

    settings = SearchSettings.of(scenario.tune)
    t0 = time.monotonic()
    probe = open_loop_probe(
        scenario,
        plan.python,
        spec.base_url,
        plan.served_name,
        plan.model_arg,
        req.out_dir / "bench",
        spec.name,
        settings.burstiness,
        settings.warmups,
        lambda t, what: tick("measuring", t, what),
        worker=worker,
    )

    def on_point(p: Point, so_far: list[Point]) -> None:
        tick("measuring", time.monotonic() - t0, f"{p.rate:g} req/s: {'meets' if p.met else 'misses'} the SLO")
        result.points = [q.as_dict() for q in so_far]  # a killed call resumes from these
        partial = Measured(
            result.key,
            result.label,
            result.overrides,
            numerics=result.numerics,
            points=result.points,
            paused=True,
            error="interrupted during the rate search",
            metrics=None,
        )
        save(partial)

    found = search_goodput(probe, clauses, settings, earlier, deadline, on_point)
    result.points = [p.as_dict() for p in found.points]
    finite = [p for p in found.points if p.rate != float("inf")]
    shown = found.best or (min(finite, key=lambda p: p.rate) if finite else found.points[-1])
    return {
        **shown.metrics,
        "goodput_rps": found.goodput_rps,
        "goodput_note": found.note,
        "offered_rps": None if shown.rate == float("inf") else shown.rate,
        "probes": len(found.points),
        "goodput_output_tokens_per_s": shown.metrics.get("output_tokens_per_s") if found.best else 0.0,
    }


def _run_measurement(
    req: TuneRequest,
    scenario: Scenario,
    scenario_path: Path,
    plan: ModelPlan,
    spec: EngineSpec,
    tick: Callable[[float], None],
    worker: BenchWorker | None = None,
) -> dict[str, Any]:
    if req.method == "locust":
        from stack.load.locust_run import run_locust
        from stack.load.measured_requests import read_records
        from stack.load.summary import summarize

        scenario = scenario.model_copy(update={"models": {plan.served_name: 1.0}})
        run = run_locust(
            scenario,
            scenario_path,
            spec.base_url,
            req.out_dir / "locust" / spec.name,
            on_tick=lambda t, _done, _err: tick(t),
        )
        return summarize(list(read_records(run.records)))
    from stack.load.vllm_bench import run_bench

    metrics, _path = run_bench(
        scenario,
        plan.python,
        spec.base_url,
        plan.served_name,
        plan.model_arg,
        req.out_dir / "bench",
        spec.name,
        tick,
        worker=worker,
    )
    return metrics
