"""Cooldowns: a deployment that keeps failing is left out of the choice for a while.

More than `gateway.allowed_fails` failures within a minute, or one 429 (the provider said "slow down"),
leave a deployment out for `gateway.cooldown_s`. Only deployments with an alternative in their model group
cool down: leaving out the only one would turn a retry into a certain 503 (LiteLLM's Router, which decided
this before, spared single-deployment groups the same way). The fallback plan and the per-request retries
are the dispatcher's; this says only who is left out now.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 60.0  # failures are counted per minute


class Cooldowns:
    def __init__(self, allowed_fails: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.allowed_fails = allowed_fails
        self.cooldown_s = cooldown_s
        self.clock = clock
        self._fails: dict[str, deque[float]] = {}
        self._until: dict[str, float] = {}  # deployment id -> when its cooldown ends

    def failed(self, dep_id: str, status: int, alone: bool) -> bool:
        """Count one failure; True when it starts a cooldown. `alone`: no other deployment serves its group."""
        if alone or self.cooldown_s <= 0:
            return False
        now = self.clock()
        fails = self._fails.setdefault(dep_id, deque())
        fails.append(now)
        while fails and fails[0] <= now - WINDOW_S:
            fails.popleft()
        if status != 429 and len(fails) <= self.allowed_fails:
            return False
        self._until[dep_id] = now + self.cooldown_s
        fails.clear()  # once it is back, it gets allowed_fails tries again
        return True

    def cooling(self) -> set[str]:
        """The deployments left out now."""
        if not self._until:
            return set()
        now = self.clock()
        for dep_id in [d for d, until in self._until.items() if until <= now]:
            del self._until[dep_id]
        return set(self._until)

    def forget(self, dep_id: str) -> None:
        """A removed deployment: an id used again later starts with a clean record."""
        self._fails.pop(dep_id, None)
        self._until.pop(dep_id, None)
