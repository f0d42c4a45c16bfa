"""How long the tune's next candidate will take, from those it has timed: what a time budget is checked against.

A candidate is its engine's start and then its measurement (and the engine's stop). A start held before its
device while the candidate before it was measured (stack.tune.prestart) has done its imports and config
already: on the lent H200 its rest took 49-78 s against 93-131 s for a cold start (8B, 2026-11-24). One
average over both kinds kept the budget from taking a held candidate that fitted, so each kind has its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean

FIRST_CANDIDATE_S = 120.0  # the least a budget must have left to start a candidate nobody has timed yet


@dataclass
class Timed:
    startup_s: float  # for a held engine: after its gate opened
    rest_s: float  # measurement and stop
    held: bool


@dataclass
class CandidateClock:
    timed: list[Timed] = field(default_factory=list)

    def record(self, startup_s: float, rest_s: float, held: bool) -> None:
        self.timed.append(Timed(max(0.0, startup_s), max(0.0, rest_s), held))

    def rest_s(self) -> float:
        """A candidate's time once its engine is ready."""
        rests = [t.rest_s for t in self.timed]
        return fmean(rests) if rests else FIRST_CANDIDATE_S / 2

    def start_s(self, held: bool) -> float:
        """A start of this kind. Where none of that kind was timed, the safe side: a held one counts as a cold
        one, a cold one as the longest held one."""
        same = [t.startup_s for t in self.timed if t.held == held]
        if same:
            return fmean(same)
        other = [t.startup_s for t in self.timed]
        return (max(other) if not held else fmean(other)) if other else FIRST_CANDIDATE_S / 2

    def need_s(self, held: bool) -> float:
        """The whole next candidate: its start of that kind and a measurement."""
        return self.start_s(held) + self.rest_s() if self.timed else FIRST_CANDIDATE_S
