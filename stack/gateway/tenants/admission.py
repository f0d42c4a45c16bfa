"""The admission queue in front of each model's local engines: priority class first, then weighted fair
queueing by tokens between the tenants of a class (adr/0043).

At most `max_in_engine` requests of a model are in its engines; the others wait here. When a place frees,
the highest class with a request that may go is served, and within it the tenant whose head request has the
smallest finish tag: self-clocked fair queueing (Golestani 1994), a request's tag = max(the class's virtual
time, its tenant's last tag) + its tokens / the tenant's weight. A tenant that floods only lengthens its own
queue; a quiet one's next request carries a tag near the virtual time and goes next. `reserve` keeps places
for light tenants: one that holds an equal share or more (counting a newcomer) fills at most
max_in_engine - reserve, so a quiet tenant's first token waits for nobody's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from stack.config.sections.tenants import AdmissionSettings
from stack.gateway.tenants.limits import OverLimit

CLASSES = 3


@dataclass
class Waiter:
    tenant: str
    tag: float
    seq: int
    future: asyncio.Future = field(repr=False)


@dataclass
class Flow:
    """One tenant's requests of one model: waiting, in the engine, and its last finish tag."""

    waiting: deque[Waiter] = field(default_factory=deque)
    in_engine: int = 0
    last_tag: float = 0.0


class ModelQueue:
    def __init__(self, cap: int, reserve: int, max_queued: int) -> None:
        self.cap, self.reserve, self.max_queued = cap, min(reserve, cap - 1), max_queued
        self.in_engine = 0
        self.flows: list[dict[str, Flow]] = [{} for _ in range(CLASSES)]
        self.virtual = [0.0] * CLASSES
        self.seq = itertools.count()

    def waiting(self) -> int:
        return sum(len(f.waiting) for flows in self.flows for f in flows.values())

    def _may_enter(self, flow: Flow) -> bool:
        """A free place, outside the reserve; or inside it for a tenant with nothing in the engine, or holding
        less than an equal share among the active tenants and one newcomer (a quiet tenant whose previous
        answer is still running, never the one that fills the rest)."""
        if self.in_engine >= self.cap:
            return False
        if self.in_engine < self.cap - self.reserve or flow.in_engine == 0:
            return True
        active = sum(len(flows) for flows in self.flows)
        return flow.in_engine < self.cap / (active + 1)

    def _flow(self, klass: int, tenant: str) -> Flow:
        flows = self.flows[klass]
        flow = flows.get(tenant)
        if flow is None:
            flow = flows[tenant] = Flow(last_tag=self.virtual[klass])
        return flow

    def enter_now(self, klass: int, tenant: str, cost: float, weight: float) -> bool:
        """Admit at once when nobody waits ahead (the common, unloaded case: no future, no await)."""
        flow = self._flow(klass, tenant)
        if any(f.waiting for flows in self.flows[: klass + 1] for f in flows.values()) or not self._may_enter(flow):
            return False
        self._admit(klass, flow, max(self.virtual[klass], flow.last_tag) + cost / weight)
        return True

    def enqueue(self, klass: int, tenant: str, cost: float, weight: float) -> Waiter:
        flow = self._flow(klass, tenant)
        if len(flow.waiting) >= self.max_queued:
            raise OverLimit(
                "queue",
                f"key {tenant!r} already has {len(flow.waiting)} requests waiting for this "
                "model (gateway.admission.max_queued_per_tenant); retry when some are answered",
                1,
            )
        tag = max(self.virtual[klass], flow.last_tag) + cost / weight
        flow.last_tag = tag
        waiter = Waiter(tenant, tag, next(self.seq), asyncio.get_running_loop().create_future())
        flow.waiting.append(waiter)
        return waiter

    def _admit(self, klass: int, flow: Flow, tag: float) -> None:
        flow.in_engine += 1
        flow.last_tag = max(flow.last_tag, tag)
        self.in_engine += 1
        self.virtual[klass] = max(self.virtual[klass], tag)

    def leave(self, klass: int, tenant: str) -> None:
        flow = self.flows[klass][tenant]
        flow.in_engine -= 1
        self.in_engine -= 1
        if flow.in_engine == 0 and not flow.waiting:
            del self.flows[klass][tenant]  # idle tenants cost nothing (1,000 keys, a few active)
        self.dispatch()

    def dispatch(self) -> None:
        """Send waiting requests into the free places: highest class first, smallest tag within it."""
        while self.in_engine < self.cap:
            best: tuple[float, int, int, int, Flow] | None = None
            for klass, flows in enumerate(self.flows):
                for flow in flows.values():
                    while flow.waiting and flow.waiting[0].future.done():  # cancelled: its client left
                        flow.waiting.popleft()
                    if flow.waiting and self._may_enter(flow):
                        head = flow.waiting[0]
                        # equal tags (a newcomer's and the flood's next): the one with less in the engine
                        if best is None or (head.tag, flow.in_engine, head.seq) < best[:3]:
                            best = (head.tag, flow.in_engine, head.seq, klass, flow)
                if best is not None:
                    break  # a higher class that can go goes first
            if best is None:
                return
            tag, _, _, klass, flow = best
            waiter = flow.waiting.popleft()
            flow.in_engine += 1
            self.in_engine += 1
            self.virtual[klass] = max(self.virtual[klass], tag)
            waiter.future.set_result(None)

    def forget(self, klass: int, tenant: str, waiter: Waiter) -> None:
        """A waiter that gave up (timeout, client gone) before it was admitted."""
        flow = self.flows[klass].get(tenant)
        if flow is None:
            return
        with contextlib.suppress(ValueError):
            flow.waiting.remove(waiter)
        if flow.in_engine == 0 and not flow.waiting:
            del self.flows[klass][tenant]
        self.dispatch()


class FairAdmission:
    def __init__(self, settings: AdmissionSettings) -> None:
        self.settings = settings
        self.queues: dict[str, ModelQueue] = {}

    def queue(self, group: str) -> ModelQueue:
        q = self.queues.get(group)
        if q is None:
            s = self.settings
            q = self.queues[group] = ModelQueue(s.per_model.get(group, s.max_in_engine), s.reserve,
                                                s.max_queued_per_tenant)  # fmt: skip
        return q

    @contextlib.asynccontextmanager
    async def place(self, group: str, tenant: str, klass: int, cost: float, weight: float) -> AsyncIterator[float]:
        """Held while the request is in the engine; yields the seconds it waited here."""
        q = self.queue(group)
        loop = asyncio.get_running_loop()
        waited = 0.0
        if not q.enter_now(klass, tenant, cost, weight):
            waiter = q.enqueue(klass, tenant, cost, weight)
            t0 = loop.time()
            q.dispatch()
            try:
                await asyncio.wait_for(asyncio.shield(waiter.future), self.settings.queue_timeout_s)
            except BaseException as exc:
                if waiter.future.done() and not waiter.future.cancelled():  # admitted as it gave up: leave
                    q.leave(klass, tenant)
                else:
                    waiter.future.cancel()
                    q.forget(klass, tenant, waiter)
                if isinstance(exc, TimeoutError):
                    raise OverLimit(
                        "queue_timeout",
                        f"`{group}` is busy: this request waited "
                        f"{self.settings.queue_timeout_s:g} s for a place in its engines "
                        "(gateway.admission.queue_timeout_s); retry later",
                        5,
                    ) from None
                raise
            waited = loop.time() - t0
        try:
            yield waited
        finally:
            q.leave(klass, tenant)
