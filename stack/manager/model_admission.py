"""The model manager's admission: who may send a request to a model now, and who waits (queues, their bounds).

- A ready model admits at once (`admit`: no lock, no await: the resident path costs ~µs).
- Otherwise the request waits in a bounded per-model queue (`manager.queue_max`), up to `queue_timeout_s`,
  or spills to the model's fallbacks while the switch runs. A failed model is refused until retry_failed_s.
- The manager imports nothing of the gateway: it raises ModelUnavailable, which the gateway renders as
  503 + Retry-After.
"""

from __future__ import annotations

import asyncio
import logging

from stack.manager.base import ManagerBase
from stack.manager.policy import EvictionOrder, SwitchKind, plan_switch
from stack.manager.slot import Slot
from stack.manager.states import ModelState
from stack.manager.switch_cost import expected_switch_s, room_wait_s
from stack.manager.unavailable import ModelUnavailable

log = logging.getLogger("stack.manager")
S = ModelState


class Ticket:
    """One admitted request; `release` when its answer is complete (streams: when the stream ends)."""

    __slots__ = ("_done", "_manager", "_slot")

    def __init__(self, manager: ManagerBase | None, slot: Slot | None) -> None:
        self._manager, self._slot, self._done = manager, slot, False

    def release(self) -> None:
        if self._done or self._slot is None or self._manager is None:
            return
        self._done = True
        self._slot.in_flight -= 1
        self._slot.last_used = self._manager.clock()
        self._manager.bump()


UNMANAGED = Ticket(None, None)


class Admission(ManagerBase):
    def switching(self) -> str | None:
        """The model a switch is running for now, or None."""
        return next((name for name, flight in self._flights.items() if not flight.done()), None)

    def manages(self, group: str) -> bool:
        return group in self.slots

    async def admit(self, group: str, can_spill: bool = False) -> Ticket | None:
        """A ticket once `group` is ready; None: serve it from its fallbacks (a switch runs meanwhile)."""
        slot = self.slots.get(group)
        if slot is None:
            return UNMANAGED
        if slot.state == S.READY and not slot.closing:
            return self._admit_now(slot, SwitchKind.RESIDENT)
        if can_spill and self.settings.spill_to_fallback:
            # Its fallbacks serve meanwhile; a failed model is retried only after retry_failed_s.
            if slot.state != S.FAILED or self.clock() - slot.failed_at >= self.settings.retry_failed_s:
                self.request_switch(group)
            return None
        self._refuse_failed(slot)
        if slot.waiting >= self.settings.queue_max:
            raise ModelUnavailable(f"`{group}` is switching and its queue is full; retry later", self.retry_after_s)
        slot.waiting += 1
        self.metrics.queue_length.labels(group).set(slot.waiting)
        t0 = self.clock()
        slot.waiting_since.append(t0)
        try:
            return await asyncio.wait_for(self._wait_admission(slot, t0), self.settings.queue_timeout_s)
        except TimeoutError:
            raise ModelUnavailable(
                f"`{group}` was not ready within {self.settings.queue_timeout_s:.0f} s "
                f"({slot.state}: {slot.detail}); retry later",
                self.retry_after_s,
            ) from None
        finally:
            slot.waiting -= 1
            slot.waiting_since.remove(t0)
            self.metrics.queue_length.labels(group).set(slot.waiting)
            self.metrics.queue_wait.labels(group).observe(self.clock() - t0)

    def expected_switch_s(self, group: str) -> float | None:
        """Seconds until `group` is awake: 0 when it is, else from this manager's own switches of it
        (stack.manager.switch_cost); None when unknown. The gateway's TTFT estimate adds it."""
        slot = self.slots.get(group)
        if slot is None:
            return None
        now, wait = self.clock(), 0.0
        if slot.state in (S.SLEEPING, S.STOPPED):
            others = [s.view() for s in self.slots.values() if s is not slot]
            plan = plan_switch(slot.view(), others, self.capacity, EvictionOrder(self.settings.eviction))
            wait = room_wait_s(others, [e.name for e in plan.evict], now, self.scheduler(), slot.waited_s(now))
        return expected_switch_s(slot.state, slot.detail, slot.since, now, slot.sleeps, self.history, group, wait)

    def _admit_now(self, slot: Slot, kind: SwitchKind) -> Ticket:
        slot.in_flight += 1
        slot.last_used = self.clock()
        if self._last_group != slot.name:
            if kind == SwitchKind.RESIDENT and self._last_group is not None:
                self.metrics.switches.labels(slot.name, str(kind)).inc()
            self._last_group = slot.name
        return Ticket(self, slot)

    def _refuse_failed(self, slot: Slot, since: float | None = None) -> None:
        if slot.state != S.FAILED:
            return
        recent = self.clock() - slot.failed_at < self.settings.retry_failed_s
        if (since is not None and slot.failed_at >= since) or (since is None and recent):
            raise ModelUnavailable(f"`{slot.name}` failed: {slot.detail} (see /admin/models)", self.retry_after_s)

    async def _wait_admission(self, slot: Slot, since: float) -> Ticket:
        while True:
            event = self._event
            if slot.state == S.READY and not slot.closing:
                return self._admit_now(slot, SwitchKind(slot.last_switch.get("kind", "cold")))
            self._refuse_failed(slot, since)
            if self.stopping:
                raise ModelUnavailable("the gateway is shutting down", self.retry_after_s)
            if slot.state != S.READY:
                self.request_switch(slot.name)
            await event.wait()
