"""The model manager's switching: which model gets the machine, when, and in which order its engines move.

- Single flight (`request_switch`): one switch task per model however many requests wait for it; and
  one switch at a time overall (`_lock`), so two switches never evict each other's model.
- Anti-thrash: a switch waits until the models it evicts may go, as the switch scheduler chosen by
  `manager.scheduler` says (stack.config.switch_schedulers: one class per policy); meanwhile those models
  stop admitting new requests when it says so (`closing`).
- Order: the target's wake overlapped with its victim's sleep, or one after the other (stack.manager.tiers).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from stack.errors import EngineError
from stack.manager.base import ManagerBase
from stack.manager.memory import NoProbe
from stack.manager.policy import Evict, EvictionOrder, SwitchKind, held, plan_switch, shares_gpu
from stack.manager.slot import Slot
from stack.manager.states import ModelState
from stack.manager.switch_cost import typical_switch_s
from stack.manager.tiers import Order, switch_order
from stack.tracing.record import clock
from stack.vllm.plugins.handoff import HandoffBroker

log = logging.getLogger("stack.manager")
S = ModelState


class Switching(ManagerBase):
    def request_switch(self, name: str, *, delay: float = 0.0, force: bool = False) -> asyncio.Task:
        """The one switch task for `name` (started if none runs)."""
        flight = self._flights.get(name)
        if flight is not None and not flight.done():
            return flight
        flight = asyncio.get_running_loop().create_task(self._switch(name, delay, force), name=f"switch {name}")
        self._flights[name] = flight
        flight.add_done_callback(_consume)
        return flight

    async def _switch(self, name: str, delay: float = 0.0, force: bool = False) -> None:
        if delay:
            await asyncio.sleep(delay)  # restart backoff, outside the lock
        slot = self.slots[name]
        async with self._lock:
            if self.stopping or slot.state == S.READY:
                return
            if slot.state == S.FAILED and not force and self.clock() - slot.failed_at < self.settings.retry_failed_s:
                return
            if self.handoff is not None and self.handoff.dropping:  # the last switch's leftovers, still being freed
                await asyncio.to_thread(self.handoff.wait_dropped)
            t0 = self.clock()
            phases: dict[str, float] = {}
            order = Order(False, "")
            trace = self._trace = (self.tracer.start(f"manager.switch {name}", clock(), **{"vstack.model": name})
                                   if self.tracer is not None else None)  # fmt: skip
            try:
                plan = await self._make_room(slot)
                phases["wait_room_s"] = round(self.clock() - t0, 3)  # waited for the models it evicts
                kind = plan.kind
                order = self.order_for(slot, plan)
                if order.overlap:
                    woke = await self._overlapped(slot, self.slots[plan.evict[0].name], phases)
                else:
                    woke = await self._sequential(slot, plan, phases)
                if not woke:
                    kind = SwitchKind.COLD
                if slot.state != S.READY:
                    t = self.clock()
                    await self._cold_start(slot)
                    phases["cold_start_s"] = round(self.clock() - t, 3)
            except BaseException as exc:
                if trace is not None:
                    trace.root.close(error=type(exc).__name__)
                    self.tracer.finish(trace)  # type: ignore[union-attr]
                raise
            finally:
                for other in self.slots.values():
                    other.closing = False
                self.bump()
                self._trace = None
            seconds = self.clock() - t0
            slot.last_switch = {"kind": str(kind), "seconds": round(seconds, 3), "reason": plan.reason,
                                "tier": str(slot.tier), "overlap": order.overlap, "order": order.reason,
                                "phases": phases}  # fmt: skip
            if trace is not None:  # the requests that waited for it name it (the gateway's admission span)
                trace.root.close(
                    **{
                        "vstack.switch.kind": str(kind),
                        "vstack.switch.reason": plan.reason,
                        "vstack.switch.tier": str(slot.tier),
                        "vstack.switch.overlap": order.overlap,
                    }
                )
                slot.last_switch.update(trace_id=trace.id, ended_ns=trace.root.end)
                self.tracer.finish(trace)  # type: ignore[union-attr]
            weights = None if slot.weights_gpu is None else round(slot.weights_gpu / 2**30, 3)
            self.history.append({"model": name, "at": time.time(), **slot.last_switch, "weights_gib": weights})
            self.metrics.switches.labels(name, str(kind)).inc()
            self.metrics.switch_seconds.labels(str(kind)).observe(seconds)
            log.info("switched to %s (%s) in %.2f s: %s", name, kind, seconds, plan.reason)

    async def _make_room(self, slot: Slot):
        """Plan, wait until the models to evict may go (the scheduler's turn: stack.config.switch_schedulers), evict."""
        started = self.clock()
        scheduler = self.scheduler()
        limit = scheduler.wait_limit_s(self.settings.drain_timeout_s)
        kind = SwitchKind.SLEEPING if slot.state == S.SLEEPING and slot.sleeps else SwitchKind.COLD
        switch_s = typical_switch_s(self.history, slot.name, kind) or 0.0
        while True:
            target = slot.view()
            if slot.state in (S.STARTING, S.FAILED):  # a pending (re)start holds nothing yet
                target = dataclasses.replace(target, state=S.STOPPED)
            others = [s.view() for s in self.slots.values() if s is not slot]
            plan = plan_switch(target, others, self.capacity, EvictionOrder(self.settings.eviction))
            now = self.clock()
            waited = slot.waited_s(now)
            turns = {e.name: scheduler.turn(self.slots[e.name].view(), now, waited, switch_s, slot.waiting)
                     for e in plan.evict}  # fmt: skip
            blocked = [self.slots[name] for name, turn in turns.items() if not turn.may_evict]
            if not blocked or now - started > limit:
                break
            for victim in blocked:
                if turns[victim.name].close:
                    victim.closing = True  # its queued requests are served, new ones wait for its turn
            await self.changed(0.25)
        self._record(slot.name, plan.kind, plan.reason, plan.evict)
        if not plan.fits:
            detail = f"does not fit: {plan.reason}"
            slot.failed_at = self.clock()
            self.move(slot, S.FAILED, detail)
            raise EngineError(f"model {slot.name!r} {detail}")
        return plan

    async def _sequential(self, slot: Slot, plan, phases: dict[str, float]) -> bool:
        """Evict, then wake the target if it sleeps. With the memory handoff (manager.sleep_handoff) the
        evicted engines' memory is held for the target's wake inside this window, and freed when it ends."""
        window = self.handoff if slot.state == S.SLEEPING else None
        if window is not None:
            window.open_window()
        try:
            one = len(plan.evict) == 1  # weights kept beside the target: decided for one model put to sleep only
            for e in plan.evict:
                t = self.clock()
                victim = self.slots[e.name]
                keep = one and e.action == Evict.SLEEP and self._keeps_weights(victim, slot)
                await self.evict(victim, e.action, keep)
                phases[f"{e.action}_{e.name}_s"] = round(self.clock() - t, 3)
            return slot.state != S.SLEEPING or await self._wake(slot, phases)
        finally:
            if window is not None:
                self._close_window(window, [self.slots[e.name] for e in plan.evict if e.action == Evict.SLEEP], phases)

    def order_for(self, slot: Slot, plan) -> Order:
        """Overlap or sequential (stack.manager.tiers.switch_order), from the memory held right now: the
        target asleep, exactly one model put to sleep for it, its weights fitting beside everything awake."""
        if slot.state != S.SLEEPING or not plan.evict:
            return Order(False, "nothing to overlap")
        sleepers = [e.name for e in plan.evict if e.action == Evict.SLEEP]
        if len(sleepers) != len(plan.evict):
            return Order(False, "a model is stopped or releases its kept weights, not only put to sleep: sequential")
        target = slot.view()  # capacity is per GPU: what the models on its GPUs hold
        views = [s.view() for s in self.slots.values()]
        free = self.capacity.total - sum(held(v, self.capacity) for v in views if shares_gpu(v, target))
        victim = self.slots[sleepers[0]]
        release_only = victim.host_copy_held and (victim.tier.sleep_level or 1) == 1
        weights = 0 if slot.weights_kept else slot.weights_gpu  # kept mapped through its sleep: nothing to place
        order = switch_order(weights, free, self.capacity.total, target_tier=slot.tier, evicted=sleepers,
                             enabled=self.settings.overlap_wake, release_only=release_only,
                             handoff=self.handoff is not None)  # fmt: skip
        if order.overlap and not isinstance(self.probe, NoProbe) and self.probe.used() is None:
            return Order(False, "no NVML reading: the freed memory could not be checked")
        log.info("switch order for %s: %s (%s)", slot.name, "overlap" if order.overlap else "sequential", order.reason)
        return order

    def _record(self, name: str, kind: SwitchKind, reason: str, evict: tuple) -> None:
        entry = {"model": name, "kind": str(kind), "reason": reason, "at": time.time(),
                 "evict": [f"{e.action} {e.name}" for e in evict]}  # fmt: skip
        self.decisions = [*self.decisions[-19:], entry]
        log.info("switch decision for %s: %s (%s)", name, kind, reason)

    def _close_window(self, window: HandoffBroker, slept: list[Slot], phases: dict[str, float]) -> None:
        """The handoff window's end: what no engine took is freed after the switch, not on its path (adr/0055),
        but for a spare the next wake maps (manager.handoff_spare, adr/0057)."""
        phases["handoff_left_gib"] = round(window.close_window(background=True, keep_bytes=self._spare_for(slept))
                                           / 2**30, 2)  # fmt: skip
        if self.settings.handoff_spare:
            phases["handoff_spare_gib"] = round(window.held_bytes() / 2**30, 2)

    async def _overlapped(self, slot: Slot, victim: Slot, phases: dict[str, float]) -> bool:
        """Put `victim` to sleep while `slot`'s weights come back (opposite directions of the bus); then the
        KV cache once the victim's memory is verifiably free. switch_order allowed it: the weights fit beside
        the victim awake. A sleep that freed too little stops the victim before the KV cache is woken. With
        the memory handoff the victim's memory is held for the KV cache's wake inside this window (adr/0035)."""
        window = self.handoff
        if window is not None:
            window.open_window()
        try:
            return await self._overlapped_in_window(slot, victim, phases)
        finally:
            if window is not None:
                self._close_window(window, [victim], phases)

    async def _overlapped_in_window(self, slot: Slot, victim: Slot, phases: dict[str, float]) -> bool:
        self.metrics.evictions.labels(victim.name, str(Evict.SLEEP)).inc()
        t = self.clock()
        before, held = self.probe.used(), self._held()
        readings_s = self.clock() - t  # NVML, read before and after the sleep: a phase of its own
        level = victim.tier.sleep_level or 1
        keep = self._keeps_weights(victim, slot) and await self._ask_keep_weights(victim)
        mapped = 0 if slot.weights_kept else (slot.weights_gpu or 0)  # what the target's weights wake maps
        self.move(victim, S.SLEEPING, f"sleep level {level}, overlapped with {slot.name}'s wake"
                  + (", weights kept on the GPU" if keep else ""))  # fmt: skip
        self.move(slot, S.STARTING, f"waking weights beside {victim.name}'s sleep")
        t = self.clock()
        slept, woke = await asyncio.gather(self._timed(phases, f"sleep_{victim.name}_s", victim.runtime.sleep, level),
                                           self._wake_weights(slot, phases), return_exceptions=True)  # fmt: skip
        phases["overlap_s"] = round(self.clock() - t, 3)
        if not isinstance(slept, BaseException):
            self._slept(victim, level, keep)
        # Mapped meanwhile: the target's weights; and what the victim handed over, still in use on the GPU.
        grown = (0 if isinstance(woke, BaseException) else mapped) + self._held() - held
        t = self.clock()
        after = None if isinstance(slept, BaseException) else self.probe.used()
        phases["memory_readings_s"] = round(readings_s + self.clock() - t, 4)
        if isinstance(slept, BaseException) or not self._verify_sleep(victim, before, after, grown):
            if isinstance(slept, BaseException):
                log.warning("sleep of %s failed (%s): stopping it", victim.name, slept)
            await self.stop_engine(victim, "sleep did not free memory; stopped")
        if isinstance(woke, BaseException):
            if not isinstance(woke, EngineError):
                raise woke
            return await self._wake_failed(slot, woke)
        try:
            await self._wake_rest(slot, phases)
        except EngineError as exc:
            return await self._wake_failed(slot, exc)
        self._ready(slot, "woken up (overlapped)")
        return True

    def last_switch(self, group: str) -> dict | None:
        """The last switch of `group`'s model as span attributes: its kind, seconds, trace id and end."""
        slot = self.slots.get(group)
        last = slot.last_switch if slot is not None else None
        if not last or "trace_id" not in last:
            return None
        return {k: last[k] for k in ("kind", "seconds", "reason", "trace_id", "ended_ns")}


def _consume(task: asyncio.Task) -> None:
    # A failed switch is reported through the slot's state (failed + log tail), not as a stray exception.
    if not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        if not isinstance(exc, EngineError):
            log.error("switch task %s crashed", task.get_name(), exc_info=exc)
