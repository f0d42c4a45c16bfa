"""`vstack bench load` as a library call: find the endpoint and the SLO, run Locust, write the report."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from stack.config.schema import StackConfig
from stack.config.slo import Clause, parse_slo
from stack.errors import ConfigError
from stack.load.locust_run import LoadTestError, run_locust
from stack.load.measured_requests import read_records
from stack.load.provenance import machine_facts
from stack.load.report import build_report
from stack.load.scenario import Scenario, find_scenario, load_scenario_file


@dataclass
class LoadResult:
    out_dir: Path
    report: dict[str, Any]

    @property
    def passed(self) -> bool | None:
        return self.report["slo"]["passed"]


def find_target(cfg: StackConfig) -> str:
    """The gateway when it answers, else the first engine `vstack up` started; base URL without /v1."""
    candidates = [f"http://127.0.0.1:{cfg.gateway.port}"] if cfg.gateway.port else []
    from stack.engine.records import RecordStore

    candidates += [r.base_url for r in RecordStore(cfg.state_dir).all() if r.alive()]
    for url in dict.fromkeys(candidates):
        try:
            # 401: a gateway with auth on is still the target (the scenario's api_key_env supplies the key).
            if httpx.get(f"{url}/v1/models", timeout=3).status_code in (200, 401):
                return url
        except httpx.HTTPError:
            continue
    raise LoadTestError("nothing answers at the gateway or any engine started by `vstack up`",
                        hint="start one with `vstack up`, or pass --url http://HOST:PORT")


def choose_slo(cli: str | None, scenario: Scenario, cfg: StackConfig | None, profile: str | None
               ) -> tuple[list[Clause], str]:
    """--slo beats the scenario's `slo:`, which beats the profile's `slo:`."""
    if cli:
        return parse_slo(cli), "--slo"
    if scenario.slo:
        return parse_slo(scenario.slo), f"{scenario.source}: slo"
    if cfg is not None and profile and profile in cfg.profiles:
        slo = getattr(cfg.profiles[profile], "slo", None)
        if slo:
            return parse_slo(slo), f"profile {profile}: slo ({cfg.where('profiles', profile, 'slo')})"
    return [], "none given"


def default_out_dir(scenario: Scenario, root: Path = Path("results/load")) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return root / f"{scenario.name}-{stamp}"


def run_load(
    scenario_name: str,
    base_url: str,
    out_dir: Path | None = None,
    duration_s: float | None = None,
    slo: str | None = None,
    cfg: StackConfig | None = None,
    profile: str | None = None,
    on_tick: Callable[[float, int, int], None] = lambda *_: None,
    models: dict[str, float] | None = None,
) -> LoadResult:
    """models: the mix decided by stack.load.target.decide_target (else the scenario's own)."""
    path = find_scenario(scenario_name)
    scenario = load_scenario_file(path)
    clauses, slo_source = choose_slo(slo, scenario, cfg, profile)
    out = out_dir or default_out_dir(scenario)
    run = run_locust(scenario, path, base_url, out, duration_s, on_tick, models)
    records = list(read_records(run.records))
    if not records:
        raise LoadTestError(f"no request finished during the run (see {run.log})",
                            hint="lengthen --duration, or check the endpoint with `curl BASE/v1/models`")
    extra = {"files": run.files(), "locust": {"returncode": run.returncode, "seconds": round(run.seconds, 1)},
             "duration_s": duration_s or scenario.load.total_s, "models": models or dict(scenario.models)}
    report = build_report(records, scenario, clauses, slo_source, base_url, machine_facts(), out, extra)
    return LoadResult(out, report)


def check_duration(duration: float | None) -> None:
    if duration is not None and duration <= 0:
        raise ConfigError(f"--duration: must be > 0 seconds (got {duration})", hint="e.g. --duration 30")
