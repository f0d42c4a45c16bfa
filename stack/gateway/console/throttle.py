"""Wrong keys at /ui/login, counted per client: past `limit` failures within `window_s` the client waits (429
with Retry-After) until the oldest of them is older than the window. Bounded: the least recent clients go first."""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque


class LoginThrottle:
    def __init__(self, limit: int = 10, window_s: float = 60.0, clients: int = 4096) -> None:
        self.limit, self.window_s, self.clients = limit, window_s, clients
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._failures.get(client) or deque()
        while times and times[0] <= now - self.window_s:
            times.popleft()
        return times

    def wait_s(self, client: str | None, now: float | None = None) -> int:
        """Seconds this client must wait before its next try; 0 when it may try now."""
        now = time.monotonic() if now is None else now
        times = self._recent(client or "", now)
        if len(times) < self.limit:
            return 0
        return max(1, math.ceil(times[0] + self.window_s - now))

    def failed(self, client: str | None, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        key = client or ""
        times = self._recent(key, now)
        times.append(now)
        self._failures[key] = times
        self._failures.move_to_end(key)
        while len(self._failures) > self.clients:
            self._failures.popitem(last=False)
