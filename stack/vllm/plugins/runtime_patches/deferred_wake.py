"""GPU: an overlapped switch's weight copies end under the KV cache's wake (issue 58, part of the runtime patch
`gpu-sleep-wake-at-bus-speed`).

In an overlapped switch the manager wakes the incoming engine's weights beside the outgoing engine's sleep, then
its KV cache once that sleep has handed its memory over (stack/manager/switching.py). The 3B -> 8B switch on an
H200 (2026-11-29-h200-switch-pair-warm-handoff) spent 0.31 s on the weights' copies, done at the bus, and then
0.05-0.07 s mapping the KV cache, although the 3B's sleep had ended 0.08-0.15 s before the copies did: the KV
cache's maps queued behind a wake call that only waited for its own copies.

So a weights-only wake that copied something returns once its copies are issued; torch's current stream waits
for them on the GPU (an event, no host wait), so any kernel the engine runs next (a forward, a weight update)
reads the weights whole. The next wake call maps its own allocations and then waits once for both; a sleep or a
staging waits first. Only engines the manager drives (its memory handoff's socket in the environment, or
VSTACK_WAKE_DEFER_WEIGHTS=1) defer: a caller that wakes the weights alone and reads them from the host would
otherwise read before the copies end. VSTACK_WAKE_DEFER_WEIGHTS=0 turns it off.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from stack.vllm.plugins.handoff import SOCKET_ENV

log = logging.getLogger("vllm.vstack_patches.sleep")  # fast_sleep_wake's: one place in the engine log

DEFER_ENV = "VSTACK_WAKE_DEFER_WEIGHTS"
ATTR = "_vstack_pending_wake"


@dataclass
class PendingWake:
    """A weights-only wake whose copies were issued and not yet waited for."""

    restored: list[tuple[Any, Any]]  # (allocation data, host tensor copied from)
    started: float  # perf_counter at the wake's start
    moved: int  # bytes copied


def defer_enabled() -> bool:
    value = os.environ.get(DEFER_ENV, "").strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    return value in ("1", "true", "yes", "on") or bool(os.environ.get(SOCKET_ENV))


def should_defer(wanted: set[str] | None, restored: list[tuple[Any, Any]]) -> bool:
    """Defer a wake of the weights alone that copied something; a whole wake (the KV cache mapped in the same
    call) or a level-2 wake (nothing copied: vLLM reloads the weights next) waits as before."""
    return wanted == {"weights"} and bool(restored) and defer_enabled()


def defer(allocator: Any, ops: Any, pending: PendingWake) -> None:
    """Leave `pending`'s copies running: the compute stream waits for them on the GPU, the next call on the host."""
    fence = getattr(ops, "fence", None)
    if fence is not None:
        fence()
    setattr(allocator, ATTR, pending)


def take(allocator: Any) -> PendingWake | None:
    """The deferred wake, if any, now the caller's to finish (after its own `ops.wait()`)."""
    pending = getattr(allocator, ATTR, None)
    if pending is not None:
        setattr(allocator, ATTR, None)
    return pending


def keep_copies(restored: list[tuple[Any, Any]], keep: bool) -> None:
    """The copies of a wake are on the GPU (waited for): each host copy becomes the kept one (or is dropped), and
    vLLM's backup is cleared, as vLLM's own wake does."""
    for data, host in restored:
        data._vstack_host = host if keep else None
        data.cpu_backup_tensor = None


def finish(pending: PendingWake, keep: bool, waited_at: float) -> None:
    """Its copies are done (the caller waited): the host copies become the kept ones, and the log says when."""
    keep_copies(pending.restored, keep)
    seconds = waited_at - pending.started
    rate = pending.moved / max(seconds, 1e-9) / 1e9
    log.info("vstack wake ['weights']: %.2f GiB copied to the GPU, done %.3f s after that wake began (%.1f GB/s; "
             "waited for under the next call)", pending.moved / 1024**3, seconds, rate)  # fmt: skip


def settle(allocator: Any, ops: Any, keep: bool) -> None:
    """Before a sleep or a staging touches the allocations: wait for a deferred wake's copies."""
    pending = take(allocator)
    if pending is not None:
        ops.wait()
        finish(pending, keep, time.perf_counter())
