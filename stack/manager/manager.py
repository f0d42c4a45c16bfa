"""ModelManager: the one owner of every managed engine. Admits requests, switches models, one at a time.

- Admission (`admit`): a ready model admits at once (no lock, no await: the resident path costs ~µs).
  Otherwise the request waits in a bounded per-model queue, up to `queue_timeout_s`, or spills to the
  model's fallbacks while the switch runs.
- Single flight (`request_switch`): one switch task per model however many requests wait for it; and
  one switch at a time overall (`_lock`), so two switches never evict each other's model.
- Anti-thrash: a switch waits until the models it evicts are drained and past their minimum residency;
  meanwhile those models stop admitting new requests once their residency is over (`closing`).
- Events: every state change is told to the subscribers (`subscribe(on_change)`, called as
  `on_change(slot, before, after)`); the gateway keeps its routing table with one. The manager imports
  nothing of the gateway: it raises ModelUnavailable, which the gateway renders as 503 + Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable

from stack.config.sections.manager import ManagerConfig
from stack.engine.runtime import logs_of
from stack.errors import EngineError
from stack.manager.memory import MemoryProbe, NoProbe
from stack.manager.metrics import ManagerMetrics
from stack.manager.policy import (
    Capacity,
    Evict,
    EvictionOrder,
    SwitchKind,
    held,
    plan_switch,
    sleep_freed_enough,
)
from stack.manager.scheduling import SCHEDULERS, Rules, Scheduler, wait_limit_s
from stack.manager.slot import Slot
from stack.manager.states import ModelState
from stack.manager.switch_cost import expected_switch_s, room_wait_s, typical_switch_s
from stack.manager.tiers import Order, Tier, TierModel, assign_tiers, switch_order
from stack.manager.unavailable import ModelUnavailable
from stack.planner.sizing import gib
from stack.tracing.record import RequestTrace, clock
from stack.tracing.tracer import Tracer
from stack.vllm.plugins.handoff import HandoffBroker

log = logging.getLogger("stack.manager")
S = ModelState
OnChange = Callable[[Slot, ModelState, ModelState], None]


class Ticket:
    """One admitted request; `release` when its answer is complete (streams: when the stream ends)."""

    __slots__ = ("_done", "_manager", "_slot")

    def __init__(self, manager: ModelManager | None, slot: Slot | None) -> None:
        self._manager, self._slot, self._done = manager, slot, False

    def release(self) -> None:
        if self._done or self._slot is None or self._manager is None:
            return
        self._done = True
        self._slot.in_flight -= 1
        self._slot.last_used = self._manager.clock()
        self._manager.bump()


UNMANAGED = Ticket(None, None)


class ModelManager:
    def __init__(self, slots: list[Slot], settings: ManagerConfig, capacity: Capacity, *,
                 metrics: ManagerMetrics | None = None, probe: MemoryProbe | None = None,
                 startup_timeout_s: float = 900, stop_grace_s: float = 20, retry_after_s: int = 5,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.slots = {s.name: s for s in slots}
        self.settings = settings
        self.capacity = capacity
        self.metrics = metrics or ManagerMetrics()
        self.probe = probe or NoProbe()
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.retry_after_s = retry_after_s
        self._subscribers: list[OnChange] = []
        self.clock = clock
        self._lock = asyncio.Lock()
        self._flights: dict[str, asyncio.Task] = {}
        self._event = asyncio.Event()
        self._last_group: str | None = None
        self.decisions: list[dict] = []  # the last switch decisions with their reasons, for /admin/models
        self.history: deque[dict] = deque(maxlen=100)  # every finished switch with its phases (the console's)
        self.stopping = False
        self.handoff: HandoffBroker | None = None  # manager.sleep_handoff: set by the composition root
        self.tracer: Tracer | None = None  # each switch a trace of its own, its phases its spans (adr/0042)
        self._trace: RequestTrace | None = None  # the switch in progress (one at a time: self._lock)
        self.assign_tiers()

    def assign_tiers(self) -> None:
        """Each model's sleeping tier (level 1, level 2, cold) from the host RAM budget: stack.manager.tiers."""
        models = [TierModel(s.name, s.weights_host, s.can_sleep and self.capacity.sleep_supported, s.prefix_cache_bytes)
                  for s in self.slots.values()]  # fmt: skip
        for name, choice in assign_tiers(models, self.capacity.host_budget, str(self.settings.sleep_level)).items():
            self.slots[name].tier, self.slots[name].tier_reason = choice.tier, choice.reason

    # -- state changes: one place, so subscribers, metrics and waiters always agree -----------------
    def subscribe(self, on_change: OnChange) -> None:
        """Call `on_change(slot, before, after)` after every state change (also a new detail, or a new
        engine address: a cold start moves to `starting` with the fresh runtime in place)."""
        self._subscribers.append(on_change)

    def bump(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def move(self, slot: Slot, state: ModelState, detail: str = "") -> None:
        before = slot.state
        slot.move(state, detail)
        if state != S.READY:
            slot.closing = False
        self.metrics.model_state.labels(slot.name, str(before)).set(0)
        self.metrics.model_state.labels(slot.name, str(state)).set(1)
        if before != state:
            log.info("model %s: %s -> %s %s", slot.name, before, state, f"({detail})" if detail else "")
        for on_change in self._subscribers:
            on_change(slot, before, state)
        self.bump()

    async def changed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)

    # -- admission ------------------------------------------------------------------------------------
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
            wait = room_wait_s(others, [e.name for e in plan.evict], now, Scheduler(self.settings.scheduler),
                               self.rules(), slot.waited_s(now))  # fmt: skip
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

    # -- switching --------------------------------------------------------------------------------------
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
                trace.root.close(**{"vstack.switch.kind": str(kind), "vstack.switch.reason": plan.reason,
                                    "vstack.switch.tier": str(slot.tier), "vstack.switch.overlap": order.overlap})
                slot.last_switch.update(trace_id=trace.id, ended_ns=trace.root.end)
                self.tracer.finish(trace)  # type: ignore[union-attr]
            weights = None if slot.weights_gpu is None else round(slot.weights_gpu / 2**30, 3)
            self.history.append({"model": name, "at": time.time(), **slot.last_switch, "weights_gib": weights})
            self.metrics.switches.labels(name, str(kind)).inc()
            self.metrics.switch_seconds.labels(str(kind)).observe(seconds)
            log.info("switched to %s (%s) in %.2f s: %s", name, kind, seconds, plan.reason)

    def rules(self) -> Rules:
        s = self.settings
        return Rules(s.min_residency_s, s.quiet_s, s.max_wait_s)

    async def _make_room(self, slot: Slot):
        """Plan, wait until the models to evict may go (the scheduler's turn: stack.manager.scheduling), evict."""
        started = self.clock()
        scheduler, rules = Scheduler(self.settings.scheduler), self.rules()
        limit = wait_limit_s(scheduler, rules, self.settings.drain_timeout_s)
        turn_of = SCHEDULERS[scheduler]
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
            turns = {e.name: turn_of(self.slots[e.name].view(), now, rules, waited, switch_s, slot.waiting)
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
            for e in plan.evict:
                t = self.clock()
                await self.evict(self.slots[e.name], e.action)
                phases[f"{e.action}_{e.name}_s"] = round(self.clock() - t, 3)
            return slot.state != S.SLEEPING or await self._wake(slot, phases)
        finally:
            if window is not None:
                left = window.close_window()
                phases["handoff_left_gib"] = round(left / 2**30, 2)

    def order_for(self, slot: Slot, plan) -> Order:
        """Overlap or sequential (stack.manager.tiers.switch_order), from the memory held right now: the
        target asleep, exactly one model put to sleep for it, its weights fitting beside everything awake."""
        if slot.state != S.SLEEPING or not plan.evict:
            return Order(False, "nothing to overlap")
        sleepers = [e.name for e in plan.evict if e.action == Evict.SLEEP]
        if len(sleepers) != len(plan.evict):
            return Order(False, "a model is stopped, not put to sleep: sequential")
        free = self.capacity.total - sum(held(s.view(), self.capacity) for s in self.slots.values())
        victim = self.slots[sleepers[0]]
        release_only = victim.host_copy_held and (victim.tier.sleep_level or 1) == 1
        order = switch_order(slot.weights_gpu, free, self.capacity.total, target_tier=slot.tier, evicted=sleepers,
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

    async def evict(self, victim: Slot, action: Evict) -> None:
        if victim.state not in (S.READY, S.SLEEPING):
            return
        self.metrics.evictions.labels(victim.name, str(action)).inc()
        if action == Evict.SLEEP and victim.state == S.READY and victim.sleeps:
            before, held = self.probe.used(), self._held()
            level = victim.tier.sleep_level or 1
            self.move(victim, S.SLEEPING, f"sleep level {level}")
            try:
                with self._phase(f"manager.sleep {victim.name}", **{"vstack.sleep_level": level}):
                    await asyncio.to_thread(victim.runtime.sleep, level)
                self._slept(victim, level)
                # Memory this sleep handed over for the next wake is still in use on the GPU, but not this engine's.
                if self._verify_sleep(victim, before, self.probe.used(), self._held() - held):
                    return
            except EngineError as exc:
                log.warning("sleep of %s failed (%s): stopping it", victim.name, exc.message)
        await self.stop_engine(victim, "evicted" if action == Evict.STOP else "sleep did not free memory; stopped")

    def _held(self) -> int:
        """Bytes the memory-handoff broker holds for a wake (manager.sleep_handoff), 0 without it."""
        return self.handoff.held_bytes() if self.handoff is not None else 0

    def _verify_sleep(self, victim: Slot, before: int | None, after: int | None, grown: int) -> bool:
        """True when the sleep is done with: NVML shows its memory freed (`grown`: bytes another engine mapped
        meanwhile, an overlapped wake), or it is an attached engine that cannot be stopped instead."""
        freed = None if before is None or after is None else before - after + grown
        if freed is not None and sleep_freed_enough(freed, 0, victim.need, self.settings.sleep_min_freed):
            victim.residue = max(0, (victim.need or 0) - freed)
            self.move(victim, S.SLEEPING, f"asleep (level {victim.tier.sleep_level}), {freed / 2**30:.1f} GiB freed")
            return True
        if not victim.runtime.owns_process:
            # An attached engine cannot be stopped instead: asleep is the most we can do.
            self.move(victim, S.SLEEPING, "asleep (freed memory not verified)")
            return True
        log.warning("sleep of %s freed too little (used %s -> %s, %s mapped meanwhile): stopping it", victim.name,
                    before, after, grown)  # fmt: skip
        return False

    @staticmethod
    def _slept(victim: Slot, level: int) -> None:
        """A level-1 sleep left the weights' host copy in the engine (kept there where it keeps one); level 2
        dropped it. Its record says so: a gateway that re-attaches it wakes it before serving (adr/0030)."""
        victim.host_copy_held = victim.keeps_host_copy and level == 1
        _mark_asleep(victim, level)

    async def stop_engine(self, slot: Slot, why: str) -> None:
        self.move(slot, S.STOPPING, why)
        slot.host_copy_held = False  # a new engine process starts without one
        with self._phase(f"manager.stop {slot.name}"):
            await asyncio.to_thread(slot.runtime.stop, self.stop_grace_s)
        slot.residue = 0
        self.move(slot, S.STOPPED, why)

    async def _timed(self, phases: dict[str, float], key: str, fn, *args) -> None:
        t = self.clock()
        with self._phase(f"manager.{key.removesuffix('_s')}"):
            await asyncio.to_thread(fn, *args)
        phases[key] = round(self.clock() - t, 3)

    @contextlib.contextmanager
    def _phase(self, name: str, **attrs: object):
        """A span of the switch in progress for what the block does (nothing outside a traced switch)."""
        span = self._trace.span(name, **attrs) if self._trace is not None else None
        try:
            yield
        except BaseException as exc:
            if span is not None:
                span.close(error=type(exc).__name__)
            raise
        if span is not None:
            span.close()

    def last_switch(self, group: str) -> dict | None:
        """The last switch of `group`'s model as span attributes: its kind, seconds, trace id and end."""
        slot = self.slots.get(group)
        last = slot.last_switch if slot is not None else None
        if not last or "trace_id" not in last:
            return None
        return {k: last[k] for k in ("kind", "seconds", "reason", "trace_id", "ended_ns")}

    async def _wake_weights(self, slot: Slot, phases: dict[str, float]) -> None:
        """The weights back on the GPU: mapped and copied from host RAM (level 1), or mapped and reloaded
        from the model's files (level 2: vLLM's reload_weights through /collective_rpc)."""
        await self._timed(phases, "wake_weights_s", slot.runtime.wake_up, ["weights"])
        if slot.tier == Tier.LEVEL2:
            await self._timed(phases, "reload_weights_s", slot.runtime.reload_weights)

    async def _wake_rest(self, slot: Slot, phases: dict[str, float]) -> None:
        await self._timed(phases, "wake_kv_cache_s", slot.runtime.wake_up, ["kv_cache"])
        await self._timed(phases, "ready_s", slot.runtime.wait_ready, 60.0)

    async def _wake(self, slot: Slot, phases: dict[str, float]) -> bool:
        """Sequential wake. Level 1: one call (vLLM maps the KV cache in the same round trip; on an H200 vLLM's
        one call was 0.02-0.1 s faster than weights then KV cache); level 2: weights, their reload from the
        files, then the KV cache."""
        self.move(slot, S.STARTING, f"waking up (level {slot.tier.sleep_level or 1})")
        try:
            if slot.tier == Tier.LEVEL2:
                await self._wake_weights(slot, phases)
                await self._wake_rest(slot, phases)
            else:
                await self._timed(phases, "wake_s", slot.runtime.wake_up, None)
                await self._timed(phases, "ready_s", slot.runtime.wait_ready, 60.0)
        except EngineError as exc:
            return await self._wake_failed(slot, exc)
        self._ready(slot, "woken up")
        return True

    async def _wake_failed(self, slot: Slot, exc: EngineError) -> bool:
        log.warning("wake-up of %s failed (%s): cold start instead", slot.name, exc.message)
        await asyncio.to_thread(slot.runtime.stop, self.stop_grace_s)
        return False

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
                phases["handoff_left_gib"] = round(window.close_window() / 2**30, 2)

    async def _overlapped_in_window(self, slot: Slot, victim: Slot, phases: dict[str, float]) -> bool:
        self.metrics.evictions.labels(victim.name, str(Evict.SLEEP)).inc()
        before, held = self.probe.used(), self._held()
        level = victim.tier.sleep_level or 1
        self.move(victim, S.SLEEPING, f"sleep level {level}, overlapped with {slot.name}'s wake")
        self.move(slot, S.STARTING, f"waking weights beside {victim.name}'s sleep")
        t = self.clock()
        slept, woke = await asyncio.gather(self._timed(phases, f"sleep_{victim.name}_s", victim.runtime.sleep, level),
                                           self._wake_weights(slot, phases), return_exceptions=True)  # fmt: skip
        phases["overlap_s"] = round(self.clock() - t, 3)
        if not isinstance(slept, BaseException):
            self._slept(victim, level)
        # Mapped meanwhile: the target's weights; and what the victim handed over, still in use on the GPU.
        grown = (0 if isinstance(woke, BaseException) else (slot.weights_gpu or 0)) + self._held() - held
        if isinstance(slept, BaseException) or not self._verify_sleep(victim, before, self.probe.used(), grown):
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

    async def _cold_start(self, slot: Slot) -> None:
        if slot.factory is not None:
            slot.runtime = slot.factory()  # a fresh free port each time (subscribers see it on the move)
        slot.host_copy_held = False  # a new engine process: its first sleep copies
        self.move(slot, S.STARTING, "cold start")
        try:
            with self._phase(f"manager.start {slot.name}"):
                pid = await asyncio.to_thread(slot.runtime.start)
            self.move(slot, S.STARTING, f"cold start, pid {pid}")
            with self._phase(f"manager.wait_ready {slot.name}"):
                seconds = await asyncio.to_thread(slot.runtime.wait_ready, self.startup_timeout_s)
        except EngineError as exc:
            slot.log_tail = exc.log_tail or logs_of(slot.runtime)
            slot.failed_at = self.clock()
            self.move(slot, S.FAILED, exc.message)
            raise
        except Exception as exc:  # any other failure (an OSError): failed with its cause, never left starting
            slot.log_tail, slot.failed_at = logs_of(slot.runtime), self.clock()
            self.move(slot, S.FAILED, f"could not start: {type(exc).__name__}: {exc}")
            raise EngineError(f"model {slot.name!r} could not start: {exc}") from exc
        # A container reached by IP has its address only now that it started: subscribers read it on `ready`.
        self._ready(slot, f"pid {pid}, ready in {seconds:.1f} s")
        self._stage_host_copy(slot)

    def _stage_host_copy(self, slot: Slot) -> asyncio.Task | None:
        """A model that sleeps to host RAM (level 1) gets its first sleep's host buffers now, in the background
        of a serving engine, instead of during its first switch (issue 37: 6.5 s of a 7.0 s first switch)."""
        stage = getattr(slot.runtime, "stage_host_copy", None)
        if not (callable(stage) and slot.sleeps and slot.tier == Tier.LEVEL1 and self.capacity.sleep_supported):
            return None
        if len(self.slots) < 2:  # nothing to switch to: only `vstack down` sleeps it, and pays its own first
            return None           # sleep then, rather than a serving engine pinning its weights' size in host RAM
        runtime = slot.runtime

        def done(task: asyncio.Task) -> None:
            if task.cancelled():
                return
            if task.exception() is not None:  # the first sleep allocates them itself, as before
                log.warning("model %s: host buffers not staged: %s", slot.name, task.exception())
            elif slot.runtime is runtime:
                slot.host_copy_held = slot.keeps_host_copy  # its first sleep only releases memory
                log.info("model %s: host buffers staged for its first sleep", slot.name)

        task = asyncio.get_running_loop().create_task(asyncio.to_thread(stage), name=f"stage {slot.name}")
        task.add_done_callback(done)
        return task

    def _ready(self, slot: Slot, detail: str) -> None:
        now = self.clock()
        slot.ready_since = slot.last_used = now
        slot.residue, slot.log_tail = 0, ""
        _mark_asleep(slot, 0)
        self.move(slot, S.READY, detail)

    async def adopt_kept(self) -> None:
        """Before the first switches: an engine re-attached asleep (`vstack down` kept it: adr/0030) is `sleeping`,
        so the normal wake path brings it back (a preloaded model before the gateway reports ready; another one
        on its first request). One asleep at another level than its tier now is stopped and started fresh."""
        for slot in self.slots.values():
            kept = getattr(slot.runtime, "kept", None)
            level = getattr(kept, "asleep", 0)
            if not level or slot.state != S.STOPPED:
                continue
            if slot.sleeps and self.capacity.sleep_supported and slot.tier.sleep_level == level:
                slot.host_copy_held = slot.keeps_host_copy and level == 1
                slot.last_used = self.clock()  # its idle and sleep timers (manager.sleep_ttl_s) start now
                self.move(slot, S.SLEEPING, f"kept asleep by `vstack down` (level {level}), re-attached")
                continue
            log.info("model %s: kept asleep at level %d, its tier now is %s: stopping it to start fresh",
                     slot.name, level, slot.tier)  # fmt: skip
            await asyncio.to_thread(slot.runtime.stop, self.stop_grace_s)

    # -- admin ------------------------------------------------------------------------------------------
    async def load(self, name: str) -> Slot:
        slot = self.slots[name]
        await self.request_switch(name, force=True)
        return slot

    async def restart(self, name: str, why: str) -> None:
        """Stop a ready engine that answers wrongly (stack.gateway.routing.adapters' golden check) and start a fresh
        one: it is `starting` from now on, so no request is admitted to the broken one."""
        slot = self.slots[name]
        if slot.state != S.READY:
            return
        self.move(slot, S.STARTING, why)
        await asyncio.to_thread(slot.runtime.stop, 5)
        self.request_switch(name, force=True)

    async def unload(self, name: str, sleep: bool = False) -> Slot:
        """Stop (or put to sleep) a model after its in-flight requests finish (up to drain_timeout_s)."""
        slot = self.slots[name]
        async with self._lock:
            slot.closing = slot.state == S.READY
            deadline = self.clock() + self.settings.drain_timeout_s
            while slot.in_flight and self.clock() < deadline:
                await self.changed(0.25)
            can = sleep and slot.can_sleep and self.capacity.sleep_supported
            if slot.state in (S.READY, S.SLEEPING):
                await self.evict(slot, Evict.SLEEP if can and slot.sleeps and slot.state == S.READY else Evict.STOP)
            elif slot.state == S.FAILED:
                self.move(slot, S.STOPPED, "unloaded")
        return slot

    async def switch(self, name: str) -> Slot:
        """Make `name` the one awake model: load it, then put every other awake model to sleep or stop it."""
        slot = await self.load(name)
        for other in self.slots.values():
            if other is not slot and other.state == S.READY:
                await self.unload(other.name, sleep=True)
        return slot

    def status(self) -> dict:
        now, host = self.clock(), self.capacity.host_budget
        return {
            "capacity_gib": round(self.capacity.total / 2**30, 2), "sleep_mode": self.capacity.sleep_supported,
            "host_budget_gib": None if host is None else round(host / 2**30, 2),
            "overlap_wake": self.settings.overlap_wake,
            "models": {n: s.public(now) for n, s in self.slots.items()}, "decisions": self.decisions,
        }  # fmt: skip

    async def shutdown(self, keep_engines: bool = False, keep_asleep: bool = False) -> list[str]:
        """Stop every engine; keep_engines: leave them running for the next gateway to re-attach; keep_asleep
        (`vstack down`, adr/0030): put each engine with sleep mode to sleep at its tier's level and leave it so,
        within the host RAM budget, and stop the others. Returns what it kept and stopped, and why."""
        self.stopping = True
        for flight in self._flights.values():
            flight.cancel()
        self.bump()
        if keep_engines:
            log.info("gateway stopping; engines kept running: %s", ", ".join(self.slots))
            return []
        keep, notes = self._to_keep_asleep() if keep_asleep else ([], [])
        for slot in list(keep):
            level = slot.tier.sleep_level or 1
            try:
                if slot.state == S.READY:
                    await asyncio.to_thread(slot.runtime.sleep, level)
            except EngineError as exc:
                keep.remove(slot)
                notes.append(f"{slot.name}: stopped: its sleep failed ({exc.message})")
                continue
            _mark_asleep(slot, level)
            notes.append(f"{slot.name}: kept asleep (level {level}), holding {gib(slot.host_held(level))} of host "
                         "RAM; GPU memory freed but its CUDA context")  # fmt: skip
        for note in notes:
            log.info("gateway stopping: %s", note)
        await asyncio.gather(*(asyncio.to_thread(s.runtime.stop, self.stop_grace_s) for s in self.slots.values()
                               if s not in keep))  # fmt: skip
        return notes

    def _to_keep_asleep(self) -> tuple[list[Slot], list[str]]:
        """The engines `vstack down` keeps asleep: awake or asleep now, with sleep mode and a sleeping tier, a
        record to say so (a local process), and their sleep's host RAM within the host RAM budget together."""
        budget, held = self.capacity.host_budget, 0
        keep, notes = [], []
        for slot in self.slots.values():
            if slot.state not in (S.READY, S.SLEEPING):
                continue
            if not (slot.can_sleep and self.capacity.sleep_supported):
                notes.append(f"{slot.name}: stopped (no sleep mode: a CPU engine, or manager.sleep: off)")
                continue
            if not slot.sleeps or not callable(getattr(slot.runtime, "mark_asleep", None)):
                why = f"its tier is cold: {slot.tier_reason}" if not slot.sleeps else "not a local engine process"
                notes.append(f"{slot.name}: stopped ({why})")
                continue
            need = slot.host_held(slot.tier.sleep_level or 1)
            if budget is not None and held + need > budget:
                notes.append(f"{slot.name}: stopped, not kept asleep: its {gib(need)} of host RAM would exceed the "
                             f"host RAM budget ({gib(budget - held)} of {gib(budget)} left; "
                             "manager.host_memory_budget_gib)")  # fmt: skip
                continue
            held += need
            keep.append(slot)
        return keep, notes


def _mark_asleep(slot: Slot, level: int) -> None:
    """Its engine's record says whether it sleeps (a local process; other runtimes have no record)."""
    mark = getattr(slot.runtime, "mark_asleep", None)
    if callable(mark):
        mark(level, slot.host_held(level) if level else 0)


def _consume(task: asyncio.Task) -> None:
    # A failed switch is reported through the slot's state (failed + log tail), not as a stray exception.
    if not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        if not isinstance(exc, EngineError):
            log.error("switch task %s crashed", task.get_name(), exc_info=exc)
