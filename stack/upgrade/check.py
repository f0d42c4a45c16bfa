"""`vstack upgrade check VERSION` as a library call: the candidate built beside the pinned vLLM, triaged, and each
profile measured on both, side by side in one run, then judged (stack.upgrade.verdict).

A candidate is a vLLM version (its own cached venv, stack.upgrade.venv) and optionally a patch change: another
ledger (`VSTACK_LEDGER` in the candidate's engines) or variables for its engines. The pinned side is what the
stack serves now (`engine_python`, default this Python).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stack.config.schema import StackConfig
from stack.config.slo import Clause, parse_slo
from stack.errors import StackError
from stack.hardware import HardwareInfo
from stack.load.load_test import choose_slo
from stack.load.provenance import machine_facts
from stack.load.scenario import Scenario, find_scenario, load_scenario_file
from stack.load.vllm_bench import BenchWorker
from stack.models import pull
from stack.patches.ledger import LEDGER_ENV, load_ledger
from stack.planner.model_planner import plan_model
from stack.planner.stack_planner import plan_fetched
from stack.tune.rate_search import SearchSettings
from stack.upgrade import answers as ans
from stack.upgrade.measure import measure_side
from stack.upgrade.triage import (
    option_changes,
    parse_check,
    patch_triage,
    plugin_load,
    runtime_outcomes_in_log,
    unpatched_in_log,
)
from stack.upgrade.venv import CandidateEnv, candidate_env
from stack.upgrade.verdict import GOODPUT_TOLERANCE, MIN_MATCH, Reason, judge
from stack.vllm.options import engine_python, installed_catalog, installed_version


@dataclass
class CheckRequest:
    version: str
    profiles: list[str | None]  # None: what `vstack up` serves
    out_dir: Path
    dist: str | None = None  # default: the pinned distribution
    scenario: str = "upgrade"
    slo: str | None = None
    prompts: int | None = None  # the first N of stack.upgrade.answers.PROMPTS
    goodput: bool = True
    max_probes: int | None = None
    min_requests: int | None = None
    probe_s: float | None = None
    repeats: int | None = None
    min_match: float = MIN_MATCH
    tolerance: float = GOODPUT_TOLERANCE
    candidate_env: dict[str, str] = field(default_factory=dict)
    candidate_ledger: Path | None = None  # a patch change: this ledger in the candidate's engines
    ledger: Path | None = None  # the ledger whose patches are triaged (default patches/ledger.yaml)
    command: str = ""


def search_settings(scenario: Scenario, req: CheckRequest) -> SearchSettings:
    s = SearchSettings.of(scenario.tune)
    for name in ("max_probes", "min_requests", "probe_s", "repeats"):
        if getattr(req, name) is not None:
            setattr(s, name, getattr(req, name))
    return s


def slo_for(req: CheckRequest, scenario: Scenario, cfg: StackConfig, profile: str) -> tuple[list[Clause], str]:
    """--slo, else the profile's `slo:`, else the check scenario's: the profile's own SLO is what it must keep."""
    clauses, source = choose_slo(req.slo, scenario.model_copy(update={"slo": []}), cfg, profile)
    if clauses:
        return clauses, source
    return (parse_slo(scenario.slo), f"{scenario.source}: slo") if scenario.slo else ([], "none given")


def run_check(cfg: StackConfig, req: CheckRequest, hardware: HardwareInfo,
              on_status: Callable[[str], None] = lambda _s: None) -> dict[str, Any]:
    """The whole check; returns the report (also written by stack.upgrade.report)."""
    t0 = time.monotonic()
    pinned_python = engine_python(cfg.engine_python)
    pinned_dist, pinned_version = installed_version(pinned_python)
    dist = req.dist or pinned_dist
    cand: CandidateEnv = candidate_env(cfg.cache_dir, dist, req.version, pinned_python, on_status)
    on_status(f"candidate: {dist} {cand.version} in {cand.python}"
              + (f" (built in {cand.built_s:.0f} s)" if cand.built_s else " (cached)" if cand.root else ""))
    pinned_cat = installed_catalog(pinned_python, cfg.cache_dir)
    cand_cat = installed_catalog(cand.python, cfg.cache_dir)
    ledger_path = req.candidate_ledger or req.ledger
    patches = patch_triage(load_ledger(ledger_path), cand.python, own_venv=cand.root is not None)
    failing, patches.runtime = plugin_load(cand.python, ledger_path)
    patches.patches += failing  # a runtime patch that raises fails the gate
    scenario_path = find_scenario(req.scenario)
    scenario = load_scenario_file(scenario_path)
    settings = search_settings(scenario, req) if req.goodput else None
    prompts = ans.chosen(req.prompts)
    extra_env = dict(req.candidate_env)
    if req.candidate_ledger is not None:
        extra_env[LEDGER_ENV] = str(Path(req.candidate_ledger).resolve())
    profiles: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        worker = stack.enter_context(BenchWorker(pinned_python, req.out_dir / "bench" / "worker.log")) \
            if req.goodput else None
        for profile in req.profiles:
            profiles.append(_check_profile(cfg, req, hardware, profile, cand, cand_cat, pinned_cat, extra_env,
                                           scenario, settings, prompts, worker, pinned_python, patches.as_dict(),
                                           on_status))
    passed = all(p["verdict"]["passed"] for p in profiles)
    return {
        "kind": "vstack-upgrade-check", "version": 1, "command": req.command,
        "pinned": {"dist": pinned_dist, "version": pinned_version, "python": pinned_python},
        "candidate": {"dist": dist, "version": cand.version, "python": cand.python,
                      "venv": str(cand.root) if cand.root else None, "built_s": cand.built_s, "torch": cand.torch,
                      "env": {k: v for k, v in extra_env.items()},
                      "ledger": str(req.candidate_ledger) if req.candidate_ledger else None},
        "machine": machine_facts(), "scenario": scenario.name, "prompts": [p.id for p in prompts],
        "search": None if settings is None else {k: getattr(settings, k) for k in (
            "min_requests", "probe_s", "warmups", "tolerance", "max_probes", "repeats", "keep_pace")},
        "rules": {"min_match": req.min_match, "goodput_tolerance": req.tolerance},
        "patches": patches.as_dict(), "profiles": profiles,
        "verdict": {"passed": passed, "reasons": [f"{p['profile']}: {r['kind']}: {r['text']}" for p in profiles
                                                  for r in p["verdict"]["reasons"]],
                    "kinds": sorted({r["kind"] for p in profiles for r in p["verdict"]["reasons"]})},
        "seconds": round(time.monotonic() - t0, 1),
    }


def _check_profile(cfg: StackConfig, req: CheckRequest, hardware: HardwareInfo, profile: str | None,
                   cand: CandidateEnv, cand_cat: Any, pinned_cat: Any, extra_env: dict[str, str],
                   scenario: Scenario, settings: SearchSettings | None, prompts: tuple[ans.Prompt, ...],
                   worker: BenchWorker | None, pinned_python: str, patches: dict[str, Any],
                   on_status: Callable[[str], None]) -> dict[str, Any]:
    # As `vstack up` plans its default model, on a free port at each start; the candidate reuses its files.
    base = plan_fetched(cfg, profile, hardware, pinned_cat, lambda entry: pull(entry, cfg), on_status)
    base = base.model_copy(update={"port": 0})
    name = base.profile
    say = lambda m: on_status(f"[{name}] {m}")  # noqa: E731
    clauses, slo_source = slo_for(req, scenario, cfg, name)
    options_error: str | None = None
    cand_plan = None
    try:
        cand_cfg = cfg.model_copy(update={"engine_python": cand.python})
        cand_cfg._origins = cfg._origins
        cand_plan = plan_model(cand_cfg, profile, hardware, cand_cat, files=base.model_files, port=0,
                               python=cand.python)
        cand_plan = cand_plan.model_copy(update={"env": {**cand_plan.env, **extra_env}})
        options_error = parse_check(cand_plan, cand_cat, cfg.cache_dir)
    except StackError as exc:
        options_error = exc.message
    changes = option_changes(cfg.cache_dir, pinned_cat, cand_cat, base)
    side = dict(out_dir=req.out_dir / name, prompts=prompts, scenario=scenario, clauses=clauses, settings=settings,
                worker=worker, bench_python=pinned_python, startup_timeout_s=cfg.startup_timeout_s,
                stop_grace_s=cfg.stop_grace_s, on_status=say)
    pinned = measure_side("pinned", base, **side)  # type: ignore[arg-type]
    if cand_plan is not None and not options_error:
        candidate = measure_side("candidate", cand_plan, **side)  # type: ignore[arg-type]
    else:
        from stack.upgrade.measure import SideResult

        candidate = SideResult("candidate", f"{cand_cat.distribution} {cand_cat.version}", cand.python,
                               error=f"not started: {options_error}")
    compared = (ans.compare_answers(pinned.answers, candidate.answers)
                if pinned.answers and candidate.answers else None)
    verdict = judge(pinned.as_dict(), candidate.as_dict(), compared, options_error, patches, req.min_match,
                    req.tolerance, goodput_checked=settings is not None and bool(clauses))
    for line in unpatched_in_log(candidate.log) if candidate.log else []:  # a patch failed in one of its processes
        verdict.reasons.append(Reason("patches", f"the candidate's engine log ({candidate.log}) says: {line}"))
        verdict.passed = False
    # Each engine process's runtime patch outcomes (applied / not needed / failed), as it logged them.
    runtime = {s.side: runtime_outcomes_in_log(s.log) if s.log else [] for s in (pinned, candidate)}
    if candidate.started and not runtime["candidate"]:
        verdict.warnings.append(f"the candidate's engine log ({candidate.log}) has no `vstack runtime patches` line: "
                                "the runtime patch plugin did not load there (is the stack installed in its Python, "
                                "or its `vllm.general_plugins` entry point declared?)")
    say("passes" if verdict.passed else "fails: " + "; ".join(r.text for r in verdict.reasons))
    return {"profile": name, "slo": [str(c) for c in clauses], "slo_source": slo_source,
            "option_changes": changes, "options_error": options_error, "pinned": pinned.as_dict(),
            "candidate": candidate.as_dict(), "answers": compared, "runtime_patches": runtime,
            "verdict": verdict.as_dict()}
