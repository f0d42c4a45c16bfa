"""How long until a model is awake: what a request for it would wait before its engine sees it.

The gateway's TTFT estimate (stack.gateway.routing.ttft_estimate) adds this to the engine's own queue, so a request to
a sleeping model waits for a wake that ends within its SLO and spills when it would not. Taken from this
manager's own switches of the model (its history), never from a guess: a model never switched the way it
would be now gives None (unknown), and the gateway keeps its old rule (spill while switching).
Pure (tests/manager/test_switch_cost.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from statistics import median

from stack.config.switch_schedulers import SwitchScheduler
from stack.manager.policy import ModelView, SwitchKind
from stack.manager.states import ModelState


def typical_switch_s(history: Iterable[Mapping], model: str, kind: SwitchKind, last: int = 5) -> float | None:
    """The median of the model's last `last` switches of `kind`: seconds from the switch's start to ready, less
    what it waited for the models it evicted (phase `wait_room_s`: that wait depends on the moment)."""
    times = [float(h["seconds"]) - float((h.get("phases") or {}).get("wait_room_s", 0.0))
             for h in history if h.get("model") == model and h.get("kind") == str(kind)]  # fmt: skip
    return median(times[-last:]) if times else None


def room_wait_s(others: Sequence[ModelView], evicted: Iterable[str], now: float, scheduler: SwitchScheduler,
                waited_s: float) -> float:  # fmt: skip
    """Seconds until every model the switch must evict gives way (the scheduler's turn_wait_s). Requests in
    flight are not waited for here (their end is not known)."""
    names = set(evicted)
    return max((scheduler.turn_wait_s(m, now, waited_s) for m in others if m.name in names), default=0.0)


def expected_switch_s(state: ModelState, detail: str, since: float, now: float, sleeps: bool,
                      history: Iterable[Mapping], model: str, residency_s: float = 0.0) -> float | None:  # fmt: skip
    """Seconds until `model` is ready: 0 when it is; a switch under way: its typical time less what has run;
    asleep or stopped: the typical switch of that kind plus the wait for the models it evicts."""
    if state == ModelState.READY:
        return 0.0
    history = list(history)
    if state == ModelState.STARTING:
        kind = SwitchKind.SLEEPING if detail.startswith("waking") else SwitchKind.COLD
        typical = typical_switch_s(history, model, kind)
        return None if typical is None else max(0.0, typical - (now - since))
    if state == ModelState.SLEEPING and sleeps:
        typical = typical_switch_s(history, model, SwitchKind.SLEEPING)
    elif state in (ModelState.STOPPED, ModelState.SLEEPING):
        typical = typical_switch_s(history, model, SwitchKind.COLD)
    else:  # failed, stopping: not before the manager tries again
        return None
    return None if typical is None else typical + residency_s
