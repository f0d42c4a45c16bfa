"""When a model waiting for its turn may take the machine from the one serving: the switch schedulers.

Two strategies behind one table (manager.scheduler), each a pure function of the models' views:

- residency: a busy model keeps the machine `min_residency_s` after it became ready (then stops admitting
  and drains); an idle one gives way once quiet for `quiet_s`. An A-B-A-B pattern swaps at most once per
  residency period, whatever the waiting requests' age.
- grouped: a waiting group's turn comes once its oldest request has waited what the switch costs (as in
  ski rental: waiting longer than a switch costs is the worse deal) if it is at least as big as the group
  being served (requests in flight), else once it has waited `max_wait_s` (or the switch's cost, if longer).
  Then the serving model stops admitting (its new requests wait for its next turn) and drains. An idle model
  gives way once quiet. Requests of one model are served together, a minority model's requests do not each
  cost the majority a switch, slow switches (cold starts) are not thrashed, and no request waits for its
  model's turn longer than max(`max_wait_s`, switch) plus the drain of the requests in flight plus the switch
  (the bound tests/manager/test_scheduling.py checks).

adr/0029 records which one is the default and the measurement behind it (bench/switch_scheduler.py).
Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from stack.manager.policy import ModelView, closes, evictable
from stack.manager.states import ModelState


class Scheduler(StrEnum):
    RESIDENCY = "residency"
    GROUPED = "grouped"


@dataclass(frozen=True)
class Rules:
    min_residency_s: float
    quiet_s: float
    max_wait_s: float


@dataclass(frozen=True)
class Turn:
    may_evict: bool  # the model in the way may go now (no request in flight, and its time is up or it is idle)
    close: bool  # it stops admitting new requests (they queue for its next turn) so that it drains


def residency_turn(victim: ModelView, now: float, rules: Rules, waited_s: float, switch_s: float,
                   waiting: int = 0) -> Turn:  # fmt: skip
    return Turn(evictable(victim, now, rules.min_residency_s, rules.quiet_s),
                closes(victim, now, rules.min_residency_s))  # fmt: skip


def grouped_turn(victim: ModelView, now: float, rules: Rules, waited_s: float, switch_s: float,
                 waiting: int = 0) -> Turn:  # fmt: skip
    """`waited_s`: how long the target's oldest waiting request has waited (0: none waits, an admin's switch);
    `switch_s`: what the switch itself takes, so that the oldest request is served by `max_wait_s`;
    `waiting`: how many requests wait for the target."""
    if victim.state != ModelState.READY:
        return Turn(True, False)
    bigger = waiting > 0 and waiting >= victim.busy  # the waiting group is at least the serving one's
    due = waited_s > 0 and waited_s >= (switch_s if bigger else max(rules.max_wait_s, switch_s))
    quiet = now - victim.last_used >= rules.quiet_s
    return Turn(not victim.busy and (due or quiet), due)


SCHEDULERS: dict[Scheduler, Callable[[ModelView, float, Rules, float, float, int], Turn]] = {
    Scheduler.RESIDENCY: residency_turn,
    Scheduler.GROUPED: grouped_turn,
}


def wait_limit_s(scheduler: Scheduler, rules: Rules, drain_timeout_s: float) -> float:
    """How long a switch waits for the models in its way before it evicts them anyway."""
    held = rules.min_residency_s if scheduler == Scheduler.RESIDENCY else rules.max_wait_s
    return held + drain_timeout_s


def turn_wait_s(scheduler: Scheduler, victim: ModelView, now: float, rules: Rules, waited_s: float) -> float:
    """Seconds until `victim` gives way to a model whose oldest request has waited `waited_s` (its in-flight
    requests' drain not counted: their end is not known). For the gateway's TTFT estimate."""
    if victim.state != ModelState.READY:
        return 0.0
    quiet = max(0.0, rules.quiet_s - (now - victim.last_used))
    if scheduler == Scheduler.RESIDENCY:
        residency = max(0.0, rules.min_residency_s - (now - victim.ready_since))
        return residency if victim.busy else min(residency, quiet)
    due = max(0.0, rules.max_wait_s - waited_s)  # the smaller group's bound (the switch itself not counted)
    return due if victim.busy else min(due, quiet)
