"""`vstack tune` as a library call: start the engine once per candidate, measure it, pick by the SLO rule.

Each candidate's engine options are laid over the profile as the top layer (like VSTACK_ENGINE__*). Every
candidate is first fitted by the planner, before any engine starts: one that cannot fit is dropped with the
planner's reason. The rest are checked by the installed vLLM's own parser (all in one child process), then
started one at a time with the usual EngineProcess, measured, and stopped before the next one starts. Goodput
mode (the default) searches the highest open-loop request rate meeting the SLO (stack.tune.rate_search, its
probes run by one `vllm bench serve` worker for the whole tune); capacity mode runs the scenario's
closed-loop users once (vllm bench serve, in that same worker, or Locust). Results go to tune-state.json after
every candidate and every probe, so a rerun of the same command skips what was measured already (resume; a
time budget ends a call cleanly between probes), and a rerun with another SLO only re-picks.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stack.config.resolve import resolve_profile
from stack.config.schema import StackConfig
from stack.errors import ConfigError, StackError
from stack.files import replace_file
from stack.hardware import HardwareInfo, match_profile
from stack.load.load_test import choose_slo
from stack.load.scenario import MIN_EXACT_MATCH, Scenario, find_scenario, load_scenario_file
from stack.load.vllm_bench import BenchWorker
from stack.models import pull
from stack.planner.model_planner import plan_model
from stack.planner.plans import ModelPlan
from stack.planner.serving import LOOK_UP
from stack.planner.stack_planner import plan_fetched
from stack.tune.candidates import Candidate
from stack.tune.choose import Measured, choose
from stack.tune.knobs import Device, Skipped, device_candidates, model_quantization, numerics_change
from stack.tune.measure_candidate import candidate_engine, measure_candidate
from stack.tune.prestart import GATE_PATCH, Prestart
from stack.tune.quality_guard import compare
from stack.tune.rate_search import Point
from stack.tune.request import Mode, TuneEvent, TuneOutcome, TuneRequest
from stack.tune.time_budget import CandidateClock
from stack.vllm.families import Registered, registered_parsers
from stack.vllm.options import VllmCatalog, check_many_with_vllm, engine_python, installed_catalog

STATE_FILE = "tune-state.json"


def configured_env(cfg: StackConfig, plan: ModelPlan) -> dict[str, str]:
    """The env the user configured (hardware < model < profile < stack), without what the stack derives at each
    start (the CPU KV cache size from free RAM varies run to run; each candidate's command records it)."""
    profile = cfg.profiles.get(plan.profile)
    return {**plan.hardware.env, **plan.model.env, **(profile.env if profile else {}), **cfg.env}


def fingerprint(cfg: StackConfig, plan: ModelPlan, scenario: Scenario, method: str, hardware: HardwareInfo,
                mode: str = "capacity") -> dict[str, Any]:
    """What a measurement depends on besides the candidate; the SLO is not in it (it only decides)."""
    return {
        "profile": plan.profile,
        "engine": plan.engine,
        "env": configured_env(cfg, plan),
        "vllm": f"{plan.vllm.distribution} {plan.vllm.version}",
        "hardware": [g.name for g in hardware.gpus] or [f"cpu x{hardware.cpu_count}"],
        # The quality floor only decides, as the SLO does: a rerun with another one re-picks.
        "scenario": scenario.model_dump(include={"load", "requests", "tune"}, exclude={"tune": {"min_exact_match"}},
                                        mode="json"),
        "method": method,
        "mode": mode,
    }


class TuneState:
    """tune-state.json: the fingerprint and every candidate's outcome, rewritten after each candidate."""

    def __init__(self, out_dir: Path, fp: dict[str, Any], restart: bool) -> None:
        self.path = out_dir / STATE_FILE
        self.fp = json.loads(json.dumps(fp, default=str))
        self.results: dict[str, dict[str, Any]] = {}
        self.spent_s = 0.0
        if self.path.is_file() and not restart:
            data = json.loads(self.path.read_text())
            if data.get("fingerprint") != self.fp:
                changed = sorted(k for k in self.fp if data.get("fingerprint", {}).get(k) != self.fp[k])
                raise ConfigError(
                    f"{self.path}: holds a tune measured under other conditions (changed: {', '.join(changed)})",
                    hint="rerun with --restart to discard it, or give another --out folder")
            self.results = data.get("results", {})
            self.spent_s = float(data.get("spent_s") or 0.0)

    def get(self, key: str) -> Measured | None:
        data = self.results.get(key)
        return Measured(**data) if data and data.get("error") is None else None

    def partial_points(self, key: str) -> list[Point]:
        """The probes of a candidate whose search a time budget cut short: its resumed search replays them."""
        data = self.results.get(key) or {}
        return [Point.from_dict(p) for p in data.get("points") or []] if data.get("paused") else []

    def put(self, m: Measured, spent_s: float | None = None) -> None:
        self.results[m.key] = asdict(m)
        self.save(spent_s)

    def save(self, spent_s: float | None = None) -> None:
        if spent_s is not None:
            self.spent_s = spent_s
        # Replaced whole: a crash mid-write never loses earlier candidates.
        replace_file(self.path, json.dumps({"fingerprint": self.fp, "spent_s": round(self.spent_s, 1),
                                            "results": self.results}, indent=2, default=str))


Emit = Callable[[TuneEvent], None]


def run_tune(cfg: StackConfig, req: TuneRequest, hardware: HardwareInfo, on_event: Emit = lambda _: None
             ) -> TuneOutcome:
    started = time.monotonic()
    deadline = started + req.time_budget_s if req.time_budget_s else None
    scenario_path = find_scenario(req.scenario)
    scenario = load_scenario_file(scenario_path)
    mode: Mode = req.mode or scenario.tune.mode
    if mode == "goodput" and req.method != "vllm-bench":
        raise ConfigError(f"--method {req.method}: goodput mode measures with vllm bench serve (open-loop arrivals)",
                          hint="use --method vllm-bench, or --mode capacity for a closed-loop Locust run")
    catalog = installed_catalog(engine_python(cfg.engine_python), cfg.cache_dir)
    parsers = registered_parsers(engine_python(cfg.engine_python))  # read once, for the base and every candidate
    profile = resolve_profile(cfg, req.target, match_profile(hardware, cfg)[0].name).name
    clauses, slo_source = choose_slo(req.slo, scenario, cfg, profile)
    if mode == "goodput" and not any(c.upper_bound and c.metric.endswith("_ms") for c in clauses):
        raise ConfigError(f"goodput mode needs a latency limit to search against (SLO from {slo_source}: "
                          f"{', '.join(map(str, clauses)) or 'none'})",
                          hint="e.g. --slo 'p95_ttft_ms<800', or --mode capacity")
    # As `vstack up` plans its default model (its ModelPlan; candidates reuse its files). vLLM's parser checks
    # it with the candidates, below.
    base = plan_fetched(cfg, req.target, hardware, catalog, lambda entry: pull(entry, cfg), parsers=parsers)
    candidates, skipped = _candidates(req, base, scenario, hardware, catalog)
    fp = fingerprint(cfg, base, scenario, req.method, hardware, mode)
    state = TuneState(req.out_dir, fp, req.restart)
    spent_before = state.spent_s
    plans, dropped = prefilter(cfg, req.target, hardware, base, [c for c in candidates if not state.get(c.key)],
                               catalog, parsers)  # fmt: skip
    dropped.update(check_candidates(candidates, plans, base, cfg.cache_dir, catalog))
    measured: list[Measured] = []
    reused = 0
    remaining = 0
    total = len(candidates)
    # Seconds per candidate, held and cold starts apart (earlier calls' included): what a budget is checked against.
    clock = CandidateClock()
    for c in candidates:
        if (m := state.get(c.key)) and m.metrics:
            clock.record(float(m.metrics.get("startup_s") or 0), float(m.metrics.get("measured_s") or 0),
                         m.metrics.get("prestart_s") is not None)
    # One `vllm bench serve` process for every probe or capacity run of every candidate (stack.load.bench_worker).
    worker: BenchWorker | None = None
    paused = False
    overlap_off = why_starts_not_overlapped(req, hardware, base)
    overlap = overlap_off is None
    pre: Prestart | None = None  # the next candidate's engine, held before its device

    def upcoming(index: int) -> Candidate | None:
        return next((c for c in candidates[index + 1:] if not state.get(c.key) and c.key not in dropped), None)

    def prestart_next(index: int) -> Callable[[float], None]:
        """Once candidate `index` is ready: start the next one held, if this call's budget will reach it."""

        def on_ready(_startup_s: float) -> None:
            nonlocal pre
            nxt = upcoming(index)
            if not overlap or nxt is None or pre is not None:
                return
            # The next starts when this one is measured if a whole held candidate is left then.
            if deadline is not None and deadline - time.monotonic() - clock.rest_s() < clock.need_s(held=True):
                return
            # How long it may wait for its gate: this call's budget, else an hour (a measurement's length is
            # not known before it ends); past it the held engine ends itself, and is started again if still wanted.
            hold = (3600.0 if deadline is None else max(60.0, deadline - time.monotonic())) + cfg.startup_timeout_s
            pre = Prestart.launch(nxt.key, candidate_engine(req, plans[nxt.key], nxt), req.out_dir / "gates", hold)
            on_event(TuneEvent(candidates.index(nxt), total, nxt, "prestarted", 0.0,
                               "started, held before its device until the current candidate ends"))

        return on_ready

    def pause(index: int, emit: Callable[..., None]) -> int:
        """The time budget ends this call at candidate `index`: how many are left for the next one."""
        left = sum(1 for c in candidates[index:] if not state.get(c.key) and c.key not in dropped)
        emit("paused", d=f"time budget: {left} candidate(s) left for the next call")
        return left

    with contextlib.ExitStack() as resources:
        resources.callback(lambda: pre and pre.discard(cfg.stop_grace_s))  # one left unmeasured: stopped
        for index, cand in enumerate(candidates):
            def emit(phase: str, t: float = 0.0, d: str = "", i: int = index, c: Candidate = cand) -> None:
                on_event(TuneEvent(i, total, c, phase, t, d))  # type: ignore[arg-type]

            earlier = state.get(cand.key)
            if earlier:
                reused += 1
                measured.append(earlier)
                emit("reused", d=_brief(earlier))
                continue
            if cand.key in dropped:
                result = dropped[cand.key]
                state.put(result)
                measured.append(result)
                emit("dropped", d=result.error or "")
                continue
            if paused:  # the budget ran out: the rest only to report what was reused or dropped
                continue
            held = pre is not None and pre.key == cand.key and pre.alive()
            if deadline is not None and deadline - time.monotonic() < clock.need_s(held):
                remaining, paused = pause(index, emit), True
                continue
            if worker is None and req.method == "vllm-bench":  # its import of vLLM overlaps the engine's start
                worker = resources.enter_context(BenchWorker(base.python, req.out_dir / "bench" / "worker.log"))
            t0 = time.monotonic()
            mine, pre = (pre, None) if pre is not None and pre.key == cand.key else (None, pre)
            result = measure_candidate(cfg, req, scenario, scenario_path, base, plans[cand.key], cand, clauses, mode,
                              state.partial_points(cand.key), deadline, emit,
                              lambda m: state.put(m, spent_before + time.monotonic() - started), worker,
                              mine, prestart_next(index))
            if result.metrics is not None and (startup := result.metrics.get("startup_s")) is not None:
                clock.record(float(startup), time.monotonic() - t0 - float(startup),
                             result.metrics.get("prestart_s") is not None)  # a held engine that exited started cold
            if result.metrics is not None:  # when, in the tune's time over every call, this figure was in
                result.metrics["tune_elapsed_s"] = round(spent_before + time.monotonic() - started, 1)
            state.put(result, spent_before + time.monotonic() - started)
            if result.paused:
                remaining, paused = pause(index, emit), True
                continue
            measured.append(result)
            emit("done" if result.ok else "failed", d=_brief(result) if result.ok else (result.error or ""))
            if not result.ok and req.stop_on_error:
                break
    state.save(spent_before + time.monotonic() - started)
    min_match = scenario.tune.min_exact_match if req.min_match is None else req.min_match
    quality = quality_checks(measured, base, min_match)
    refused = {key: q["note"] for key, q in quality.items() if q.get("below")}
    outcome = TuneOutcome(scenario, clauses, slo_source, measured, choose(measured, clauses, refused), base,
                          reused, fp, mode, skipped, remaining, state.spent_s)
    outcome.quality = quality
    outcome.overlap_off = overlap_off
    return outcome


def overlap_wanted(req: TuneRequest, hardware: HardwareInfo) -> bool:
    """What was asked for: --overlap-starts / --no-overlap-starts, else on with a GPU and off on a CPU."""
    return bool(hardware.gpus) if req.overlap_starts is None else req.overlap_starts


def why_starts_not_overlapped(req: TuneRequest, hardware: HardwareInfo, base: ModelPlan) -> str | None:
    """Why the next candidate's engine is not started while the current one is measured; None: it is. Only
    where the start gate holds it: an engine the gate does not hold would take the device at once."""
    if not overlap_wanted(req, hardware):
        if req.overlap_starts is False:
            return "--no-overlap-starts"
        return "off by default on a CPU (its cores are the measurement; --overlap-starts to force)"
    if req.gate_blocker is None:
        return f"the {GATE_PATCH} runtime patch was not checked for this vLLM (no gate_blocker given)"
    why = req.gate_blocker(GATE_PATCH, base.vllm.distribution, base.vllm.version, {**os.environ, **base.env})
    return f"the {GATE_PATCH} runtime patch would not hold the engine: {why}" if why else None


def _candidates(req: TuneRequest, base: ModelPlan, scenario: Scenario, hardware: HardwareInfo,
                catalog: VllmCatalog) -> tuple[list[Candidate], list[Skipped]]:  # fmt: skip
    if req.candidates is not None:
        return req.candidates, []
    files = base.model_files.path if base.model_files else None
    device = Device(base.hardware.accelerator, bool(base.hardware.fp8), catalog, dict(base.engine),
                    model_quantization(files), scenario.requests.shared_prefix_tokens > 0)
    found, skipped = device_candidates(device)
    if req.max_candidates is not None:
        keep = max(0, req.max_candidates - (1 if req.baseline else 0))
        skipped += [Skipped(c.label, f"beyond --max-candidates {req.max_candidates}") for c in found[keep:]]
        found = found[:keep]
    return ([Candidate({})] if req.baseline else []) + found, skipped


def prefilter(cfg: StackConfig, target: str | None, hardware: HardwareInfo, base: ModelPlan,
              candidates: list[Candidate], catalog: VllmCatalog, parsers: Registered | str | None = LOOK_UP
              ) -> tuple[dict[str, ModelPlan], dict[str, Measured]]:
    """Every candidate fitted by the planner before any engine starts: (plans by key, dropped by key).

    The planner sees what the candidate changes (weights quantization, KV dtype, token budget, sequences);
    one that cannot fit is dropped with the planner's own reason, and nothing is started for it. vLLM's
    parser checks the survivors next (check_candidates)."""
    plans: dict[str, ModelPlan] = {}
    dropped: dict[str, Measured] = {}
    for cand in candidates:
        try:
            plans[cand.key] = plan_model(candidate_config(cfg, cand), target, hardware, catalog,
                                         files=base.model_files, fetched=base.model_files is not None, port=0,
                                         parsers=parsers)
        except StackError as exc:
            m = Measured(cand.key, cand.label, cand.overrides, numerics=numerics_change(cand.overrides))
            m.error = f"dropped before start: {exc.message.splitlines()[0][:300]}"
            dropped[cand.key] = m
    return plans, dropped


def check_candidates(candidates: list[Candidate], plans: dict[str, ModelPlan], base: ModelPlan,
                     cache_dir: Path | None, catalog: VllmCatalog) -> dict[str, Measured]:
    """vLLM's own parser on the profile's and every candidate's command, in one child process before any
    engine starts (a child each cost 10-20 s per candidate on the lent GPUs). A refused profile is an error,
    as `vstack up` says it; a refused candidate is a result, not a crash, and its plan is removed."""
    todo = [c for c in candidates if c.key in plans]
    argvs = [base.vllm_args()] + [plans[c.key].vllm_args() for c in todo]
    base_error, *errors = check_many_with_vllm(base.python, argvs, catalog, cache_dir)
    if base_error:  # the profile itself, as `vstack up` would refuse it
        raise ConfigError(f"vLLM {catalog.version} rejects the rendered command: {base_error}",
                          hint="`vstack config render` shows the command; fix the option it names")
    refused: dict[str, Measured] = {}
    for cand, error in zip(todo, errors, strict=True):
        if error:
            plan = plans.pop(cand.key)
            m = Measured(cand.key, cand.label, cand.overrides, numerics=numerics_change(cand.overrides))
            m.error = f"rejected: vLLM {plan.vllm.version} rejects the rendered command: {error}"
            refused[cand.key] = m
    return refused


def quality_checks(measured: list[Measured], base: ModelPlan, min_match: float = MIN_EXACT_MATCH
                   ) -> dict[str, dict[str, Any]]:
    """For each candidate that changes numerics: its answers vs the baseline's (exact match at temperature 0,
    the first diverging token of each changed answer), and whether it is below the floor `min_match`."""
    dummy = str(base.engine.get("load_format") or "") == "dummy"
    baseline = next((m for m in measured if not m.overrides and m.answers), None)
    out: dict[str, dict[str, Any]] = {}
    for m in measured:
        if not m.numerics:
            continue
        if dummy:
            out[m.key] = {"numerics": m.numerics, "exact_match": None, "below": False,
                          "note": "not possible: dummy weights (random numbers answer nothing to compare)"}
        elif not m.answers or baseline is None:
            out[m.key] = {"numerics": m.numerics, "exact_match": None, "below": False,
                          "note": "not checked: the baseline's or this candidate's answers are missing"}
        else:
            out[m.key] = {"numerics": m.numerics, **compare(baseline.answers or [], baseline.answer_tokens,
                                                            m.answers, m.answer_tokens, min_match)}
    return out


def _brief(m: Measured) -> str:
    x = m.metrics or {}
    ttft = x.get("p95_ttft_ms")
    head = f"goodput {m.score:,.2f} req/s, " if "goodput_rps" in x else ""
    return head + f"{m.throughput:,.1f} tok/s" + (f", p95 TTFT {ttft:,.0f} ms" if ttft is not None else "")


def candidate_config(cfg: StackConfig, cand: Candidate) -> StackConfig:
    """The candidate's options as the top engine layer; the origins (for error messages) carry over."""
    copy = cfg.model_copy(update={"engine": {**cfg.engine, **cand.overrides}})
    copy._origins = cfg._origins
    return copy


