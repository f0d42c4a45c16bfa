"""When a model waiting for its turn may take the machine from the one serving: the switch schedulers.

One class per policy, all in one table (`SCHEDULERS`, by name). `manager.scheduler` chooses from it (the
configuration's choices are the table's keys: stack.config.sections.manager), and the model manager asks the
chosen one (stack.manager.switching). A new policy is one class here, added to the table; nothing else
names a policy. Each answers three questions about a model in the way of a switch:

- `turn`: may it be evicted now, and does it stop admitting new requests so that it drains;
- `holds_s`: how long it may keep the machine before the switch evicts it anyway (plus the drain);
- `turn_wait_s`: seconds until it gives way (the gateway's TTFT estimate adds them).

The policies:

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

adr/0029 records which one is the default and the measurement behind it (bench/switch_scheduler.py). Here,
beside the configuration rather than in stack.manager, because the configuration lists its choices from the
table and may not import the layers above it (adr/0045-manager-by-concern-and-names-by-what-they-decide.md).
Nothing here reads a clock, does I/O or imports the rest of the stack: a model is seen through `View`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Protocol

READY = "ready"  # stack.manager.states.ModelState.READY (a StrEnum: equal to its value)


class View(Protocol):
    """What a scheduler reads of a model (stack.manager.policy.ModelView)."""

    @property
    def state(self) -> str: ...
    @property
    def busy(self) -> int: ...  # requests in flight plus requests admitted and waiting for it
    @property
    def last_used(self) -> float: ...
    @property
    def ready_since(self) -> float: ...


@dataclass(frozen=True)
class Rules:
    min_residency_s: float
    quiet_s: float
    max_wait_s: float


@dataclass(frozen=True)
class Turn:
    may_evict: bool  # the model in the way may go now (no request in flight, and its time is up or it is idle)
    close: bool  # it stops admitting new requests (they queue for its next turn) so that it drains


class SwitchScheduler(ABC):
    """One switch policy, over the manager's numbers (`Rules`)."""

    name: ClassVar[str]  # its `manager.scheduler` value

    def __init__(self, rules: Rules) -> None:
        self.rules = rules

    @abstractmethod
    def turn(self, victim: View, now: float, waited_s: float, switch_s: float, waiting: int = 0) -> Turn:
        """`waited_s`: how long the target's oldest waiting request has waited (0: none waits, an admin's switch);
        `switch_s`: what the switch itself takes; `waiting`: how many requests wait for the target."""

    @abstractmethod
    def holds_s(self) -> float:
        """How long a model in the way may keep the machine before the switch evicts it anyway (drain aside)."""

    @abstractmethod
    def turn_wait_s(self, victim: View, now: float, waited_s: float) -> float:
        """Seconds until `victim` gives way to a model whose oldest request has waited `waited_s` (its in-flight
        requests' drain not counted: their end is not known). For the gateway's TTFT estimate."""

    def wait_limit_s(self, drain_timeout_s: float) -> float:
        """How long a switch waits for the models in its way before it evicts them anyway."""
        return self.holds_s() + drain_timeout_s

    def quiet_left_s(self, victim: View, now: float) -> float:
        return max(0.0, self.rules.quiet_s - (now - victim.last_used))


class Residency(SwitchScheduler):
    name = "residency"

    def turn(self, victim: View, now: float, waited_s: float, switch_s: float, waiting: int = 0) -> Turn:
        return Turn(self._evictable(victim, now), self._closes(victim, now))

    def holds_s(self) -> float:
        return self.rules.min_residency_s

    def turn_wait_s(self, victim: View, now: float, waited_s: float) -> float:
        if victim.state != READY:
            return 0.0
        residency = max(0.0, self.rules.min_residency_s - (now - victim.ready_since))
        return residency if victim.busy else min(residency, self.quiet_left_s(victim, now))

    def _evictable(self, m: View, now: float) -> bool:
        """May this model give way now? Not while it serves; and a model in use keeps a minimum residency,
        so that an A-B-A-B pattern swaps at most once per residency period, not on every request."""
        if m.busy:
            return False
        if m.state != READY:
            return True
        return now - m.ready_since >= self.rules.min_residency_s or now - m.last_used >= self.rules.quiet_s

    def _closes(self, m: View, now: float) -> bool:
        """A model that another one is waiting to replace stops admitting new requests once its residency is
        over: its queued and in-flight requests finish first, then the switch goes ahead (no starvation)."""
        return now - m.ready_since >= self.rules.min_residency_s


class Grouped(SwitchScheduler):
    name = "grouped"

    def turn(self, victim: View, now: float, waited_s: float, switch_s: float, waiting: int = 0) -> Turn:
        if victim.state != READY:
            return Turn(True, False)
        bigger = waiting > 0 and waiting >= victim.busy  # the waiting group is at least the serving one's
        due = waited_s > 0 and waited_s >= (switch_s if bigger else max(self.rules.max_wait_s, switch_s))
        quiet = now - victim.last_used >= self.rules.quiet_s
        return Turn(not victim.busy and (due or quiet), due)

    def holds_s(self) -> float:
        return self.rules.max_wait_s

    def turn_wait_s(self, victim: View, now: float, waited_s: float) -> float:
        if victim.state != READY:
            return 0.0
        due = max(0.0, self.rules.max_wait_s - waited_s)  # the smaller group's bound (the switch itself not counted)
        return due if victim.busy else min(due, self.quiet_left_s(victim, now))


SCHEDULERS: dict[str, type[SwitchScheduler]] = {s.name: s for s in (Residency, Grouped)}
