"""The model manager's engine lifecycle: start (cold), wake, sleep, stop; the engines `vstack down` kept asleep
adopted at start; every engine stopped (or kept) at shutdown. Each step moves the slot's state (`move`).
"""

from __future__ import annotations

import asyncio
import logging

from stack.engine.runtime import logs_of
from stack.errors import EngineError
from stack.manager.base import ManagerBase
from stack.manager.policy import Evict, held, shares_gpu, sleep_freed_enough
from stack.manager.slot import Slot
from stack.manager.states import ModelState
from stack.manager.tiers import Tier, overlap_margin
from stack.planner.sizing import gib

log = logging.getLogger("stack.manager")
S = ModelState


class Lifecycle(ManagerBase):
    async def _cold_start(self, slot: Slot) -> None:
        await self._drop_spare()  # vLLM's start checks that NVML shows its share of the GPU free
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
            return None  # sleep then, rather than a serving engine pinning its weights' size in host RAM
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
        if self.settings.warm_handoff and self.handoff is not None:
            warm = asyncio.get_running_loop().create_task(self._warm_handoff(slot, runtime, task),
                                                          name=f"warm hand-over {slot.name}")  # fmt: skip
            self._warming[slot.name] = warm
        return task

    async def _warm_handoff(self, slot: Slot, runtime: object, staged: asyncio.Task, idle_wait_s: float = 60) -> bool:
        """manager.warm_handoff (issue 58, adr/0053): one sleep and wake of a freshly started engine once its host
        buffers are staged. Its first sleep releases vLLM's own allocations, which cannot be handed over; the
        driver clears that memory (~98 GiB on an H200) with a copy engine, and during a switch that ran beside the
        next engine's weight copies (~30 GB/s instead of 54, the first switch 1.42x the steady one). Done here,
        the clearing costs no switch, and the engine's memory is in exportable pieces from its first switch on.
        It waits for a moment with nothing in flight (requests keep being served meanwhile: none waits for more
        than the sleep and wake themselves, 0.6-0.9 s on an H200). True if it ran; skipped (False) when the engine
        is busy for `idle_wait_s`, gone, or switched meanwhile."""
        since = slot.ready_since  # a switch that slept and woke it meanwhile did the same: nothing left to do
        await asyncio.wait({staged})
        busy = getattr(runtime, "host_copy_busy", None)
        started = self.clock()
        while callable(busy) and await asyncio.to_thread(busy) and self.clock() - started < 300:
            await asyncio.sleep(0.5)  # staging runs in the engine's background while it serves
        waited = self.clock()
        while slot.in_flight and self.clock() - waited < idle_wait_s:
            await self.changed(0.25)  # not closed: requests are admitted and served as usual
        async with self._lock:  # no switch meanwhile: the engine's memory is released and retaken alone
            if self.stopping or slot.runtime is not runtime or slot.state != S.READY or slot.ready_since != since:
                return False
            if slot.in_flight:  # never idle: its first switch pays the release instead
                log.info("model %s: warm hand-over skipped, %d requests in flight for %.0f s", slot.name,
                         slot.in_flight, idle_wait_s)  # fmt: skip
                return False
            slot.closing = True  # requests from now on queue for the sleep and wake
            try:
                t0 = self.clock()
                self.move(slot, S.SLEEPING, "warm hand-over: sleep and wake once, memory into handoff pieces")
                try:
                    await asyncio.to_thread(runtime.sleep, 1)  # type: ignore[attr-defined]
                    self.move(slot, S.STARTING, "warm hand-over: waking, its memory in handoff pieces")
                    await asyncio.to_thread(runtime.wake_up)  # type: ignore[attr-defined]
                except EngineError as exc:
                    log.warning("model %s: warm hand-over failed (%s): stopping it", slot.name, exc.message)
                    await self.stop_engine(slot, "warm hand-over failed; stopped")
                    return False
                self._ready(slot, f"warm hand-over done in {self.clock() - t0:.2f} s")
                return True
            finally:
                slot.closing = False
                self.bump()

    def _ready(self, slot: Slot, detail: str) -> None:
        now = self.clock()
        slot.ready_since = slot.last_used = now
        slot.residue, slot.log_tail, slot.weights_kept = 0, "", False
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

    async def evict(self, victim: Slot, action: Evict, keep_weights: bool = False) -> None:
        """Sleep or stop `victim`; `keep_weights` (_keeps_weights decided it): a level-1 sleep leaves its weights
        mapped."""
        if victim.state not in (S.READY, S.SLEEPING):
            return
        self.metrics.evictions.labels(victim.name, str(action)).inc()
        # A release: nothing to do where nothing is kept (NVML said so after its sleep); one that fails stops it below.
        release = action == Evict.RELEASE and victim.state == S.SLEEPING
        if release and (not victim.weights_kept or await self._release_kept(victim)):
            return
        if action == Evict.SLEEP and victim.state == S.READY and victim.sleeps:
            before, handed = self.probe.used(), self._held()
            level = victim.tier.sleep_level or 1
            keep_weights = keep_weights and await self._ask_keep_weights(victim)
            kept = ", weights kept on the GPU" if keep_weights else ""
            self.move(victim, S.SLEEPING, f"sleep level {level}{kept}")
            try:
                with self._phase(f"manager.sleep {victim.name}", **{"vstack.sleep_level": level}):
                    await asyncio.to_thread(victim.runtime.sleep, level)
                self._slept(victim, level, keep_weights)
                # Memory this sleep handed over for the next wake is still in use on the GPU, but not this engine's.
                if self._verify_sleep(victim, before, self.probe.used(), self._held() - handed):
                    return
            except EngineError as exc:
                log.warning("sleep of %s failed (%s): stopping it", victim.name, exc.message)
        why = {Evict.STOP: "evicted", Evict.RELEASE: "its kept weights were not released; stopped"}
        await self.stop_engine(victim, why.get(action, "sleep did not free memory; stopped"))

    async def _release_kept(self, victim: Slot) -> bool:
        """The weights a sleeper kept mapped (manager.sleep_keeps_weights) back to its host copy, for a model that
        needs their memory: it stays asleep and its next wake copies them, as a plain level-1 sleeper's does. True
        when NVML shows them freed (or cannot say); False: the caller stops it."""
        before, handed = self.probe.used(), self._held()
        try:
            with self._phase(f"manager.release {victim.name}"):
                await asyncio.to_thread(victim.runtime.release_kept_weights)  # type: ignore[attr-defined]
        except Exception as exc:  # an engine that cannot: stopped instead, as before this existed
            log.warning("model %s: its kept weights could not be released (%s)", victim.name,
                        getattr(exc, "message", exc))  # fmt: skip
            return False
        after, weights = self.probe.used(), victim.weights_gpu or 0
        freed = None if before is None or after is None else before - after + self._held() - handed
        if freed is not None and freed < 0.9 * weights:
            log.warning("model %s: releasing its kept weights freed %.1f GiB of %.1f", victim.name, freed / 2**30,
                        weights / 2**30)  # fmt: skip
            return False
        victim.weights_kept = False
        self.move(victim, S.SLEEPING, "asleep (level 1), its weights released for another model"
                  + ("" if freed is None else f": {freed / 2**30:.1f} GiB freed"))  # fmt: skip
        return True

    @staticmethod
    async def _ask_keep_weights(victim: Slot) -> bool:
        """Ask `victim`'s engine to keep its weights mapped through its next sleep (that sleep only). False when it
        cannot (an engine without the runtime patch answers an error): it then sleeps as always."""
        try:
            await asyncio.to_thread(victim.runtime.keep_weights_mapped)  # type: ignore[attr-defined]
            return True
        except Exception as exc:  # any failure here only costs the optimisation
            log.warning("model %s: its engine cannot keep its weights through a sleep (%s); a plain sleep",
                        victim.name, getattr(exc, "message", exc))  # fmt: skip
            return False

    def _keeps_weights(self, victim: Slot, target: Slot) -> bool:
        """manager.sleep_keeps_weights (adr/0058): `victim`'s level-1 sleep may leave its weights mapped when its
        engine can, and they fit, with the overlap's margin, beside `target` at its full need and everything
        else held on their GPU. Switching back then maps a KV cache and copies no weights."""
        if not (self.settings.sleep_keeps_weights and victim.weights_gpu and (victim.tier.sleep_level or 1) == 1
                and callable(getattr(victim.runtime, "keep_weights_mapped", None))):  # fmt: skip
            return False
        v, t = victim.view(), target.view()
        others = [s.view() for s in self.slots.values() if s is not victim and s is not target]
        beside = sum(held(o, self.capacity) for o in others if shares_gpu(o, v))
        need = self.capacity.total if t.need is None else t.need
        total = self.capacity.total
        return beside + need + victim.weights_gpu + overlap_margin(total) <= total

    def _spare_for(self, slept: list[Slot]) -> int:
        """Bytes of a switch's leftover kept for the next wake (manager.handoff_spare, adr/0057): the weights of
        the models it put to sleep, the likeliest next wake's. 0 when off."""
        if not self.settings.handoff_spare:
            return 0
        return sum(v.weights_gpu or 0 for v in slept if not v.weights_kept)  # kept weights need no memory back

    async def _drop_spare(self) -> None:
        # The broker's own holdings decide, not the setting: a spare kept before the setting was turned off counts.
        if self.handoff is not None and self.handoff.held_bytes():
            dropped = await asyncio.to_thread(self.handoff.drop_spare)
            log.info("freed the %s spare of the memory handoff before an engine start", gib(dropped))

    def _held(self) -> int:
        """Bytes the memory-handoff broker holds for a wake (manager.sleep_handoff), 0 without it."""
        return self.handoff.held_bytes() if self.handoff is not None else 0

    def _verify_sleep(self, victim: Slot, before: int | None, after: int | None, grown: int) -> bool:
        """True when the sleep is done with: NVML shows its memory freed (`grown`: bytes another engine mapped
        meanwhile, an overlapped wake), or it is an attached engine that cannot be stopped instead."""
        freed = None if before is None or after is None else before - after + grown
        kept = (victim.weights_gpu or 0) if victim.weights_kept else 0  # still mapped, by design
        expect = None if victim.need is None else victim.need - kept
        if freed is not None and sleep_freed_enough(freed, 0, expect, self.settings.sleep_min_freed):
            held = max(0, (victim.need or 0) - freed)
            if kept and held < 0.9 * kept:  # NVML says they went after all: the next wake copies them
                log.warning("model %s: asked to keep its weights through the sleep, it released them", victim.name)
                victim.weights_kept, kept = False, 0
            victim.residue = max(0, held - kept)  # the kept weights are counted apart (Slot.view: kept)
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
    def _slept(victim: Slot, level: int, weights_kept: bool = False) -> None:
        """A level-1 sleep left the weights' host copy in the engine (kept there where it keeps one); level 2
        dropped it. Its record says so: a gateway that re-attaches it wakes it before serving (adr/0030)."""
        victim.host_copy_held = victim.keeps_host_copy and level == 1
        victim.weights_kept = weights_kept
        _mark_asleep(victim, level)

    async def stop_engine(self, slot: Slot, why: str) -> None:
        self.move(slot, S.STOPPING, why)
        slot.host_copy_held = slot.weights_kept = False  # a new engine process starts without either
        with self._phase(f"manager.stop {slot.name}"):
            await asyncio.to_thread(slot.runtime.stop, self.stop_grace_s)
        slot.residue = 0
        self.move(slot, S.STOPPED, why)

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

    async def shutdown(self, keep_engines: bool = False, keep_asleep: bool = False) -> list[str]:
        """Stop every engine; keep_engines: leave them running for the next gateway to re-attach; keep_asleep
        (`vstack down`, adr/0030): put each engine with sleep mode to sleep at its tier's level and leave it so,
        within the host RAM budget, and stop the others. Returns what it kept and stopped, and why."""
        self.stopping = True
        for flight in [*self._flights.values(), *self._warming.values()]:
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
