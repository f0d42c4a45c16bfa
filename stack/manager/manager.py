"""ModelManager: the one owner of every managed engine. Admits requests, switches models, one at a time.

Its concerns, one module each, joined here into the one object the gateway holds:

- admission (stack.manager.model_admission): a ready model admits at once; others' requests wait in bounded queues
  or spill to fallbacks;
- switching (stack.manager.switching): one switch at a time, its turn decided by the switch scheduler that
  `manager.scheduler` names (stack.config.switch_schedulers), its order (overlapped or sequential);
- lifecycle (stack.manager.engine_lifecycle): start, wake, sleep, stop an engine, adopt the kept ones, shut down;
- what they share (stack.manager.base): the slots, the settings, the one place a state changes.

Here: what an admin asks (/admin/models: load, unload, switch, restart) and the status it reads.
Events: every state change is told to the subscribers (`subscribe(on_change)`, called as
`on_change(slot, before, after)`); the gateway keeps its routing table with one.
"""

from __future__ import annotations

import asyncio

from stack.manager.engine_lifecycle import Lifecycle
from stack.manager.model_admission import Admission
from stack.manager.policy import Evict
from stack.manager.slot import Slot
from stack.manager.states import ModelState
from stack.manager.switching import Switching

S = ModelState


class ModelManager(Admission, Switching, Lifecycle):
    """Every managed engine's owner (see the module's docstring); built by the composition root."""

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
