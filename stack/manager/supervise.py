"""The watch loop: crashes noticed within a second, restarts with backoff, idle models put away.

It only looks and enqueues: restarts go through the manager's switch path (single flight, memory
check), evictions through its lock, so the loop never races a switch.
"""

from __future__ import annotations

import asyncio
import logging

from stack.engine.runtime import logs_of
from stack.manager.manager import ModelManager
from stack.manager.policy import Evict, IdleAction, idle_action, restart_delay
from stack.manager.slot import Slot
from stack.manager.states import ModelState

log = logging.getLogger("stack.manager")
S = ModelState


async def watch(manager: ModelManager, interval: float = 0.5) -> None:
    while not manager.stopping:
        try:
            for slot in list(manager.slots.values()):
                if slot.state in (S.READY, S.SLEEPING) and slot.runtime.exit_code() is not None:
                    await on_crash(manager, slot)
            if manager.settings.idle_ttl_s and not manager._lock.locked():
                await put_away_idle(manager)
        except asyncio.CancelledError:
            raise
        except Exception:  # the watch must outlive any one failure; it is logged, never swallowed silently
            log.exception("manager watch: one pass failed")
        await asyncio.sleep(interval)


async def on_crash(manager: ModelManager, slot: Slot) -> None:
    """The engine exited: its state changes at once (never `ready` with a dead pid while what is left of it
    is stopped, which takes up to the grace period), then the rest of it goes, then a restart if any."""
    code = slot.runtime.exit_code()
    tail = logs_of(slot.runtime)
    now = manager.clock()
    st = manager.settings
    if slot.state == S.SLEEPING:
        manager.move(slot, S.STOPPED, f"exited with code {code} while asleep; starts again on the next request")
        await asyncio.to_thread(slot.runtime.stop, 5)
        return
    slot.restarts = [t for t in slot.restarts if now - t < st.restart_window_s]
    delay = restart_delay(len(slot.restarts), st.restart_max, st.restart_backoff_s)
    if delay is None:
        slot.log_tail, slot.failed_at = tail, now
        manager.move(slot, S.FAILED, f"exited with code {code}; {len(slot.restarts)} restarts in "
                     f"{st.restart_window_s:.0f} s, giving up")  # fmt: skip
        await asyncio.to_thread(slot.runtime.stop, 5)
        return
    slot.restarts.append(now)
    manager.metrics.restarts.labels(slot.name).inc()
    log.error("engine of %s exited with code %s; restarting in %.1f s", slot.name, code, delay)
    manager.move(slot, S.STARTING, f"exited with code {code}; restart {len(slot.restarts)}/{st.restart_max} "
                 f"in {delay:.0f} s")  # fmt: skip
    # Whatever is left of the engine (its engine-core child after a kill -9 of the API server) goes too,
    # before the restart is asked for.
    await asyncio.to_thread(slot.runtime.stop, 5)
    manager.request_switch(slot.name, delay=delay, force=True)


async def put_away_idle(manager: ModelManager) -> None:
    st = manager.settings
    now = manager.clock()
    for slot in list(manager.slots.values()):
        action = idle_action(slot.view(), now, st.idle_ttl_s, st.sleep_ttl_s, manager.capacity.sleep_supported)
        if action == IdleAction.NONE or manager._lock.locked():
            continue
        async with manager._lock:
            if idle_action(slot.view(), manager.clock(), st.idle_ttl_s, st.sleep_ttl_s,
                           manager.capacity.sleep_supported) != action:  # fmt: skip
                continue
            log.info("model %s idle for %.0f s: %s", slot.name, now - slot.last_used, action)
            await manager.evict(slot, Evict.SLEEP if action == IdleAction.SLEEP else Evict.STOP)
