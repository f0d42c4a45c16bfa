"""What `vstack tune` is asked (TuneRequest), what it says while it runs (TuneEvent) and what it answers
(TuneOutcome)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from stack.config.slo import Clause
from stack.load.scenario import Scenario
from stack.planner.plans import ModelPlan
from stack.tune.candidates import Candidate
from stack.tune.choose import Choice, Measured
from stack.tune.knobs import Skipped

Method = Literal["vllm-bench", "locust"]


Mode = Literal["goodput", "capacity"]


@dataclass
class TuneEvent:
    index: int  # 0-based position in the candidate list
    total: int
    candidate: Candidate
    phase: Literal["reused", "dropped", "starting", "measuring", "done", "failed", "paused"]
    elapsed_s: float = 0.0
    detail: str = ""


@dataclass
class TuneRequest:
    target: str | None  # profile or model, as `vstack up` takes it
    scenario: str
    candidates: list[Candidate] | None  # None: the knobs for this device and model (stack.tune.knobs)
    out_dir: Path
    slo: str | None = None
    method: Method = "vllm-bench"
    restart: bool = False
    command: str = ""  # how it was invoked, for the written profile
    stop_on_error: bool = False  # a failed candidate ends the run (costly machines: do not start the rest)
    mode: Mode | None = None  # None: the scenario's tune.mode
    time_budget_s: float | None = None  # end this call cleanly before it runs out; the next call resumes
    max_candidates: int | None = None  # generated candidates only: the first N in order of promise
    baseline: bool = True  # generated candidates only: the profile as it is, first
    # Start the next candidate's engine while the current one is measured, held before its device
    # (stack.tune.prestart). None: on with a GPU; off on a CPU, where the engine's own work needs the cores.
    overlap_starts: bool | None = None
    # Why a runtime patch would not run in an engine: (patch id, vLLM distribution, version, env) -> reason or
    # None. The composition root passes stack.patches.plugin.would_run (this layer cannot read the ledger).
    gate_blocker: Callable[[str, str, str, dict[str, str]], str | None] | None = None
    # The quality guard's floor: a numerics candidate whose answers match the baseline's less is not chosen.
    # None: the scenario's tune.min_exact_match (stack.tune.quality_guard says why its default is 0.5).
    min_match: float | None = None


@dataclass
class TuneOutcome:
    scenario: Scenario
    clauses: list[Clause]
    slo_source: str
    measured: list[Measured]
    choice: Choice
    base: ModelPlan
    reused: int
    fingerprint: dict[str, Any] = field(default_factory=dict)
    mode: Mode = "goodput"
    skipped: list[Skipped] = field(default_factory=list)  # knobs not tried, and why
    remaining: int = 0  # candidates left for the next call (time budget)
    spent_s: float = 0.0  # wall time of every call of this tune so far
    quality: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> numerics check
    overlap_off: str | None = None  # why starts were not overlapped (None: they were)

    @property
    def complete(self) -> bool:
        return self.remaining == 0
