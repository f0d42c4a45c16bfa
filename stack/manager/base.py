"""What every concern of the model manager shares: its slots and settings, the one place a state changes (`move`:
subscribers, metrics and waiters always agree), the switch scheduler chosen by `manager.scheduler`, and the
trace of the switch in progress. ModelManager (stack.manager.manager) joins the concerns: admission
(stack.manager.model_admission), switching (stack.manager.switching), lifecycle (stack.manager.engine_lifecycle).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable

from stack.config.sections.manager import ManagerConfig
from stack.config.switch_schedulers import SCHEDULERS, Rules, SwitchScheduler
from stack.manager.memory import MemoryProbe, NoProbe
from stack.manager.metrics import ManagerMetrics
from stack.manager.policy import Capacity
from stack.manager.slot import Slot
from stack.manager.states import ModelState
from stack.manager.tiers import TierModel, assign_tiers
from stack.tracing.record import RequestTrace
from stack.tracing.tracer import Tracer
from stack.vllm.plugins.handoff import HandoffBroker

log = logging.getLogger("stack.manager")
S = ModelState
OnChange = Callable[[Slot, ModelState, ModelState], None]


class ManagerBase:
    """The state the concerns share. Each concern calls the others through `self` (ModelManager is all of them):
    admission asks switching for a switch (`request_switch`), switching asks lifecycle to evict, wake, start."""

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
        self._warming: dict[str, asyncio.Task] = {}  # manager.warm_handoff: each started engine's sleep-and-wake
        self.tracer: Tracer | None = None  # each switch a trace of its own, its phases its spans (adr/0042)
        self._trace: RequestTrace | None = None  # the switch in progress (one at a time: self._lock)
        self.assign_tiers()

    def assign_tiers(self) -> None:
        """Each model's sleeping tier (level 1, level 2, cold) from the host RAM budget: stack.manager.tiers."""
        models = [TierModel(s.name, s.weights_host, s.can_sleep and self.capacity.sleep_supported, s.prefix_cache_bytes)
                  for s in self.slots.values()]  # fmt: skip
        for name, choice in assign_tiers(models, self.capacity.host_budget, str(self.settings.sleep_level)).items():
            self.slots[name].tier, self.slots[name].tier_reason = choice.tier, choice.reason

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

    def rules(self) -> Rules:
        s = self.settings
        return Rules(s.min_residency_s, s.quiet_s, s.max_wait_s)

    def scheduler(self) -> SwitchScheduler:
        """The policy `manager.scheduler` names, from the one table (stack.config.switch_schedulers.SCHEDULERS)."""
        return SCHEDULERS[self.settings.scheduler](self.rules())

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
