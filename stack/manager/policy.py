"""Switching decisions as small pure functions: what a switch to a model costs, and whom it evicts.

Nothing here does I/O or reads a clock: the manager passes views of its models and `now`, so every rule
is tested with plain values (tests/manager/test_policy.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from stack.manager.states import ModelState

GIB = 1024**3


class SwitchKind(StrEnum):
    RESIDENT = "resident"  # already loaded: nothing to do
    SLEEPING = "sleeping"  # wake a sleeping engine
    COLD = "cold"  # start an engine


class Evict(StrEnum):
    SLEEP = "sleep"
    STOP = "stop"
    RELEASE = "release"  # a sleeper's kept weights (manager.sleep_keeps_weights) leave the GPU; it stays asleep


@dataclass(frozen=True)
class ModelView:
    """What the policy knows of one model."""

    name: str
    state: ModelState
    need: int | None  # bytes the engine takes while awake; None: unknown (treated as the whole machine)
    last_used: float = 0.0
    ready_since: float = 0.0
    busy: int = 0  # requests in flight plus requests admitted and waiting for it
    can_sleep: bool = False
    residue: int = 0  # bytes a sleeping engine still holds (measured after its sleep), its kept weights aside
    kept: int = 0  # bytes of weights a sleeping engine keeps mapped (manager.sleep_keeps_weights, adr/0058)
    gpus: frozenset[int] | None = None  # the GPUs its engine is pinned to (CUDA_VISIBLE_DEVICES); None: from the first


def shares_gpu(a: ModelView, b: ModelView) -> bool:
    """Whether two models' engines compete for one GPU's memory: every engine counts its GPUs from the first unless
    its environment pins it (stack.manager.memory.pinned_gpus), so only two pinned to disjoint GPUs do not."""
    return a.gpus is None or b.gpus is None or bool(a.gpus & b.gpus)


@dataclass(frozen=True)
class Capacity:
    total: int  # bytes the engines may use together
    sleep_supported: bool  # GPU engines started with sleep mode
    host_budget: int | None = None  # host RAM the level-1 sleepers' weights may take (None: unknown)


@dataclass(frozen=True)
class Eviction:
    name: str
    action: Evict


@dataclass(frozen=True)
class SwitchPlan:
    kind: SwitchKind
    evict: tuple[Eviction, ...] = ()
    reason: str = ""
    fits: bool = True


def held(m: ModelView, capacity: Capacity) -> int:
    """Bytes a model holds now."""
    if m.state in (ModelState.READY, ModelState.STARTING, ModelState.STOPPING):
        return capacity.total if m.need is None else m.need
    if m.state == ModelState.SLEEPING:
        return m.residue + m.kept
    return 0


def _gib(n: int) -> str:
    return "unbounded" if n >= 1 << 60 else f"{n / GIB:.1f} GiB"


# -- which resident model gives way first: a str-Enum -> ordering function table ---------------------
def lru_order(models: Sequence[ModelView]) -> list[ModelView]:
    return sorted(models, key=lambda m: m.last_used)


def largest_first(models: Sequence[ModelView]) -> list[ModelView]:
    return sorted(models, key=lambda m: (-(m.need or 1 << 62), m.last_used))


class EvictionOrder(StrEnum):
    LRU = "lru"
    LARGEST = "largest"


ORDERS: dict[EvictionOrder, Callable[[Sequence[ModelView]], list[ModelView]]] = {
    EvictionOrder.LRU: lru_order,
    EvictionOrder.LARGEST: largest_first,
}


def plan_switch(
    target: ModelView, others: Sequence[ModelView], capacity: Capacity, order: EvictionOrder = EvictionOrder.LRU
) -> SwitchPlan:
    """Resident > co-resident > sleep the others > stop the others, least recently used first."""
    if target.state == ModelState.READY:
        return SwitchPlan(SwitchKind.RESIDENT, reason=f"{target.name} is resident")
    kind = SwitchKind.SLEEPING if target.state == ModelState.SLEEPING else SwitchKind.COLD
    others = [m for m in others if shares_gpu(m, target)]  # capacity is per GPU: the others on its GPUs
    # Its whole need against what the others hold: a sleeping target's own residue and kept weights are part of
    # that need once it is awake (subtracting them from the need as well counted them twice: a 7B woken beside a
    # sleeper's kept 15 GiB went 1.7 GiB past the GPU in tests/manager/test_sleep_keeps_weights.py's trio).
    need = capacity.total if target.need is None else target.need
    used = sum(held(m, capacity) for m in others)
    free = capacity.total - used
    if need <= free:
        beside = [m.name for m in others if held(m, capacity)]
        where = f"next to {', '.join(beside)}" if beside else "on an empty machine"
        return SwitchPlan(kind, reason=f"{target.name} ({_gib(need)}) fits {where} ({_gib(free)} free)")
    evictions: list[Eviction] = []
    awake = ORDERS[order]([m for m in others if m.state == ModelState.READY])
    # First pass: put awake models to sleep where sleep frees their memory; stop the rest.
    for m in awake:
        if free >= need:
            break
        sleep = capacity.sleep_supported and m.can_sleep
        evictions.append(Eviction(m.name, Evict.SLEEP if sleep else Evict.STOP))
        free += held(m, capacity) - (m.residue if sleep else 0)
    # Second pass: weights a sleeper kept mapped go back to its host copy (it stays asleep, its wake copies them
    # as any level-1 wake does) before any engine is stopped.
    for m in ORDERS[order]([m for m in others if m.state == ModelState.SLEEPING and m.kept]):
        if free >= need:
            break
        evictions.append(Eviction(m.name, Evict.RELEASE))
        free += m.kept
    # Third pass: sleeping engines still hold a residue (CUDA context); stop them if it is still short.
    asleep = [m for m in others if m.state == ModelState.SLEEPING] + [
        m for m in awake if Eviction(m.name, Evict.SLEEP) in evictions
    ]
    for m in ORDERS[order](asleep):
        if free >= need:
            break
        gained = m.residue
        for action in (Evict.SLEEP, Evict.RELEASE):
            if Eviction(m.name, action) in evictions:
                evictions[evictions.index(Eviction(m.name, action))] = Eviction(m.name, Evict.STOP)
                break
        else:
            evictions.append(Eviction(m.name, Evict.STOP))
            gained += m.kept
        free += gained
    fits = free >= need
    moves = ", ".join(f"{e.action} {e.name}" for e in evictions) or "nothing to evict"
    why = f"{target.name} needs {_gib(need)}, {_gib(capacity.total - used)} free: {moves}"
    if not fits:
        why += f"; still short of {_gib(need - free)} (busy engines starting or stopping)"
    return SwitchPlan(kind, tuple(evictions), why, fits)


class IdleAction(StrEnum):
    NONE = "none"
    SLEEP = "sleep"
    STOP = "stop"


def idle_action(m: ModelView, now: float, idle_ttl_s: float, sleep_ttl_s: float, sleep_supported: bool) -> IdleAction:
    """Ollama's keep_alive, in two steps on a GPU: idle -> sleep, long asleep -> stop."""
    if m.busy:
        return IdleAction.NONE
    if m.state == ModelState.READY and idle_ttl_s and now - m.last_used >= idle_ttl_s:
        return IdleAction.SLEEP if sleep_supported and m.can_sleep else IdleAction.STOP
    if m.state == ModelState.SLEEPING and sleep_ttl_s and now - m.last_used >= idle_ttl_s + sleep_ttl_s:
        return IdleAction.STOP
    return IdleAction.NONE


def restart_delay(recent_restarts: int, restart_max: int, backoff_s: float) -> float | None:
    """Seconds to wait before restarting a crashed engine; None when the budget is spent (-> failed)."""
    if recent_restarts >= restart_max:
        return None
    return backoff_s * 2**recent_restarts


def sleep_freed_enough(used_before: int | None, used_after: int | None, need: int | None, min_fraction: float) -> bool:
    """NVML check after a sleep: did the device's used memory really drop? (Some vLLM versions kept it.)
    Unknown numbers (no NVML) count as not verified, and the caller falls back to a stop."""
    if used_before is None or used_after is None:
        return False
    expected = need if need else used_before
    return used_before - used_after >= min_fraction * expected
