"""`vstack tune` as a library call: start the engine once per candidate, measure it, pick by the SLO rule.

Each candidate's engine options are laid over the profile as the top layer (like VSTACK_ENGINE__*), planned
and checked by the installed vLLM's own parser, started with the usual EngineProcess, measured (vllm bench
serve, or Locust), and stopped before the next one starts. Results go to tune-state.json after every
candidate, so a rerun of the same command skips what was measured already (resume), and a rerun with
another SLO only re-picks.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from stack.assemble import plan_one
from stack.config.schema import StackConfig
from stack.config.slo import Clause
from stack.engine.launch import EnginePlan, plan_engine
from stack.engine.process import EngineProcess, EngineSpec
from stack.errors import ConfigError, StackError
from stack.hardware import HardwareInfo
from stack.load.candidates import Candidate
from stack.load.choose import Choice, Measured, choose
from stack.load.load import choose_slo
from stack.load.scenario import Scenario, find_scenario, load_scenario_file

Method = Literal["vllm-bench", "locust"]
STATE_FILE = "tune-state.json"


@dataclass
class TuneEvent:
    index: int  # 0-based position in the candidate list
    total: int
    candidate: Candidate
    phase: Literal["reused", "starting", "measuring", "done", "failed"]
    elapsed_s: float = 0.0
    detail: str = ""


@dataclass
class TuneRequest:
    target: str | None  # profile or model, as `vstack up` takes it
    scenario: str
    candidates: list[Candidate]
    out_dir: Path
    slo: str | None = None
    method: Method = "vllm-bench"
    restart: bool = False
    command: str = ""  # how it was invoked, for the written profile
    stop_on_error: bool = False  # a failed candidate ends the run (costly machines: do not start the rest)


@dataclass
class TuneOutcome:
    scenario: Scenario
    clauses: list[Clause]
    slo_source: str
    measured: list[Measured]
    choice: Choice
    base: EnginePlan
    reused: int
    fingerprint: dict[str, Any] = field(default_factory=dict)


def configured_env(cfg: StackConfig, plan: EnginePlan) -> dict[str, str]:
    """The env the user configured (hardware < model < profile < stack), without what the stack derives at each
    start (the CPU KV cache size from free RAM varies run to run; each candidate's command records it)."""
    r = plan.resolved
    profile = cfg.profiles.get(r.name)
    return {**r.hardware.env, **r.model.env, **(profile.env if profile else {}), **cfg.env}


def fingerprint(cfg: StackConfig, plan: EnginePlan, scenario: Scenario, method: str, hardware: HardwareInfo
                ) -> dict[str, Any]:
    """What a measurement depends on besides the candidate; the SLO is not in it (it only decides)."""
    return {
        "profile": plan.resolved.name,
        "engine": plan.resolved.engine,
        "env": configured_env(cfg, plan),
        "vllm": f"{plan.catalog.distribution} {plan.catalog.version}",
        "hardware": [g.name for g in hardware.gpus] or [f"cpu x{hardware.cpu_count}"],
        "scenario": scenario.model_dump(include={"load", "requests", "tune"}, mode="json"),
        "method": method,
    }


class TuneState:
    """tune-state.json: the fingerprint and every candidate's outcome, rewritten after each candidate."""

    def __init__(self, out_dir: Path, fp: dict[str, Any], restart: bool) -> None:
        self.path = out_dir / STATE_FILE
        self.fp = json.loads(json.dumps(fp, default=str))
        self.results: dict[str, dict[str, Any]] = {}
        if self.path.is_file() and not restart:
            data = json.loads(self.path.read_text())
            if data.get("fingerprint") != self.fp:
                changed = sorted(k for k in self.fp if data.get("fingerprint", {}).get(k) != self.fp[k])
                raise ConfigError(
                    f"{self.path}: holds a tune measured under other conditions (changed: {', '.join(changed)})",
                    hint="rerun with --restart to discard it, or give another --out folder")
            self.results = data.get("results", {})

    def get(self, key: str) -> Measured | None:
        data = self.results.get(key)
        return Measured(**data) if data and data.get("error") is None else None

    def put(self, m: Measured) -> None:
        self.results[m.key] = asdict(m)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"fingerprint": self.fp, "results": self.results}, indent=2, default=str))
        os.replace(tmp, self.path)  # a crash mid-write never loses earlier candidates


Emit = Callable[[TuneEvent], None]


def run_tune(cfg: StackConfig, req: TuneRequest, hardware: HardwareInfo, on_event: Emit = lambda _: None
             ) -> TuneOutcome:
    scenario_path = find_scenario(req.scenario)
    scenario = load_scenario_file(scenario_path)
    base = plan_engine(cfg, req.target, hardware, port=0)
    clauses, slo_source = choose_slo(req.slo, scenario, cfg, base.resolved.name)
    # As `vstack up` plans it: fetched, then fitted from the real files (candidates reuse those files).
    base = plan_one(cfg, req.target, hardware, on_status=lambda _s: None, port=base.port)
    fp = fingerprint(cfg, base, scenario, req.method, hardware)
    state = TuneState(req.out_dir, fp, req.restart)
    measured: list[Measured] = []
    reused = 0
    total = len(req.candidates)
    for index, cand in enumerate(req.candidates):
        earlier = state.get(cand.key)
        if earlier:
            reused += 1
            measured.append(earlier)
            on_event(TuneEvent(index, total, cand, "reused", detail=_brief(earlier)))
            continue
        result = _measure(cfg, req, scenario, scenario_path, base, hardware, cand,
                          lambda phase, t, d="", i=index, c=cand: on_event(TuneEvent(i, total, c, phase, t, d)))
        state.put(result)
        measured.append(result)
        on_event(TuneEvent(index, total, cand, "done" if result.ok else "failed",
                           detail=_brief(result) if result.ok else (result.error or "")))
        if not result.ok and req.stop_on_error:
            break
    return TuneOutcome(scenario, clauses, slo_source, measured, choose(measured, clauses), base, reused, fp)


def _brief(m: Measured) -> str:
    x = m.metrics or {}
    ttft = x.get("p95_ttft_ms")
    return f"{m.throughput:,.1f} tok/s" + (f", p95 TTFT {ttft:,.0f} ms" if ttft is not None else "")


def candidate_config(cfg: StackConfig, cand: Candidate) -> StackConfig:
    """The candidate's options as the top engine layer; the origins (for error messages) carry over."""
    copy = cfg.model_copy(update={"engine": {**cfg.engine, **cand.overrides}})
    copy._origins = cfg._origins
    return copy


def _measure(cfg: StackConfig, req: TuneRequest, scenario: Scenario, scenario_path: Path, base: EnginePlan,
             hardware: HardwareInfo, cand: Candidate, tick: Callable[..., None]) -> Measured:
    result = Measured(cand.key, cand.label, cand.overrides)
    try:
        plan = plan_engine(candidate_config(cfg, cand), req.target, hardware, port=0, model_files=base.model_files)
    except StackError as exc:  # vLLM's parser refused the combination: a result, not a crash
        result.error = f"rejected: {exc.message}"
        return result
    log = req.out_dir / "logs" / f"{cand.key}.engine.log"
    log.unlink(missing_ok=True)
    spec = plan.engine_spec(log, name=f"tune-{cand.key}")
    engine = EngineProcess(spec)
    started = time.monotonic()
    try:
        engine.start()
        tick("starting", 0.0)
        startup = engine.wait_ready(cfg.startup_timeout_s, lambda t, line: tick("starting", t, line[-80:]))
        metrics = _run_measurement(req, scenario, scenario_path, plan, spec,
                                   lambda t: tick("measuring", t))
        result.metrics = {**metrics, "startup_s": round(startup, 1),
                          "measured_s": round(time.monotonic() - started - startup, 1),
                          "command": plan.display(), "log": str(log)}
    except StackError as exc:
        result.error = exc.message.splitlines()[0][:300]
    finally:
        engine.stop(cfg.stop_grace_s)
    return result


def _run_measurement(req: TuneRequest, scenario: Scenario, scenario_path: Path, plan: EnginePlan, spec: EngineSpec,
                     tick: Callable[[float], None]) -> dict[str, Any]:
    if req.method == "locust":
        from stack.load.locust_run import run_locust
        from stack.load.records import read_records
        from stack.load.summary import summarize

        scenario = scenario.model_copy(update={"models": {plan.resolved.served_name: 1.0}})
        run = run_locust(scenario, scenario_path, spec.base_url, req.out_dir / "locust" / spec.name,
                         on_tick=lambda t, _done, _err: tick(t))
        return summarize(list(read_records(run.records)))
    from stack.load.vllm_bench import run_bench

    metrics, _path = run_bench(scenario, plan.python, spec.base_url, plan.resolved.served_name, plan.model_arg,
                               req.out_dir / "bench", spec.name, tick)
    return metrics
