"""One managed model: its engine, its state (changed only through `move`), and its counters."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from stack.engine.runtime import Runtime
from stack.manager.policy import ModelView
from stack.manager.states import ModelState, check_move
from stack.manager.tiers import Tier


@dataclass
class Slot:
    name: str  # the model group clients ask for
    runtime: Runtime
    factory: Callable[[], Runtime] | None = None  # a fresh engine (new free port) for each cold start
    need: int | None = None
    need_source: str = ""
    can_sleep: bool = False
    state: ModelState = ModelState.STOPPED
    detail: str = ""
    since: float = field(default_factory=time.monotonic)
    ready_since: float = 0.0
    last_used: float = 0.0
    in_flight: int = 0
    waiting: int = 0  # requests queued for this model (not yet admitted)
    waiting_since: list[float] = field(default_factory=list)  # when each of them began to wait (manager's clock)
    closing: bool = False  # a switch waits to evict it: new requests queue instead of being admitted
    residue: int = 0
    restarts: list[float] = field(default_factory=list)  # monotonic times of recent restarts
    failed_at: float = 0.0
    log_tail: str = ""
    last_switch: dict = field(default_factory=dict)  # kind, seconds, reason of the last switch to it
    weights_gpu: int | None = None  # weight bytes per GPU (the planner's): what an overlapped wake adds
    weights_host: int | None = None  # weight bytes of all ranks: what a level-1 sleep keeps in host RAM
    tier: Tier = Tier.COLD  # where it waits asleep (stack.manager.tiers), set when the manager is built
    tier_reason: str = ""
    prefix_cache_bytes: int = 0  # host RAM its prefix cache takes across sleep (stack.vllm.kv_offload)
    keeps_host_copy: bool = False  # its engine keeps the weights' host copy between sleeps (stack.engine.sleep_copy)
    host_copy_held: bool = False  # ... and holds one now (an earlier level-1 sleep of this engine process)
    weights_kept: bool = False  # asleep with its weights still mapped on the GPU (manager.sleep_keeps_weights)
    gpus: frozenset[int] | None = None  # pinned by its environment (stack.manager.memory.pinned_gpus); None: from 0

    def waited_s(self, now: float) -> float:
        """How long its oldest queued request has waited (0: none waits)."""
        return now - min(self.waiting_since) if self.waiting_since else 0.0

    def move(self, state: ModelState, detail: str = "") -> None:
        check_move(self.name, self.state, state)
        self.state, self.detail, self.since = state, detail, time.monotonic()

    def host_held(self, level: int) -> int:
        """Host RAM its engine holds asleep at `level`: the weights' copy at level 1, its prefix cache's CPU tier."""
        return ((self.weights_host or 0) if level == 1 else 0) + self.prefix_cache_bytes

    @property
    def sleeps(self) -> bool:
        """Put to sleep (not stopped) to make room: sleep mode on and a sleeping tier."""
        return self.can_sleep and self.tier != Tier.COLD

    def view(self) -> ModelView:
        kept = (self.weights_gpu or 0) if self.weights_kept and self.state == ModelState.SLEEPING else 0
        return ModelView(self.name, self.state, self.need, self.last_used, self.ready_since,
                         self.in_flight, self.sleeps, self.residue, kept, self.gpus)  # fmt: skip

    def public(self, now: float) -> dict:
        return {
            "state": str(self.state), "detail": self.detail, "for_s": round(now - self.since, 1),
            "need_gib": None if self.need is None else round(self.need / 1024**3, 2), "need_source": self.need_source,
            "can_sleep": self.can_sleep, "tier": str(self.tier), "tier_reason": self.tier_reason,
            "weights_gib": None if self.weights_host is None else round(self.weights_host / 1024**3, 2),
            "prefix_cache_gib": round(self.prefix_cache_bytes / 1024**3, 2),
            "in_flight": self.in_flight, "queued": self.waiting,
            "idle_s": round(now - self.last_used, 1) if self.last_used else None,
            "restarts": len(self.restarts), "last_switch": self.last_switch,
            "gpus": None if self.gpus is None else sorted(self.gpus),
            "weights_kept": self.weights_kept,  # asleep with its weights on the GPU (manager.sleep_keeps_weights)
            "log_tail": self.log_tail if self.state == ModelState.FAILED else "",
            "engine": getattr(self.runtime.spec, "base_url", None),
            **(self.runtime.describe() if hasattr(self.runtime, "describe") else {}),  # replicas on Ray
        }  # fmt: skip
