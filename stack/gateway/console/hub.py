"""Server-Sent Events for the console: one bounded queue per open page, a bounded number of pages.

Events are pushed, never polled by the browser: `models` on each of the manager's state changes (its
`on_change`) and, once a second while at least one page listens, `live` (the engines' and the gateway's
Prometheus series), `log` (new log lines) and `activity` (the requests answered since the last second, in one
event: a request itself pays only its entry in the ring, however many pages are open). With no page open the
ticker does not run and a publish is a loop over an empty set: the console costs `/v1` nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

log = logging.getLogger("stack.gateway.console")
TOPICS = frozenset({"models", "live", "activity", "log"})


class TooManyStreams(Exception):
    pass


class Client:
    def __init__(self, owner: str, topics: set[str], size: int) -> None:
        self.owner, self.topics, self.role = owner, topics, "viewer"
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(size)
        self.dropped = 0

    def put(self, frame: bytes) -> None:
        """A slow page loses its oldest events, never blocks the gateway nor grows without bound."""
        if self.queue.full():
            with contextlib.suppress(asyncio.QueueEmpty):
                self.queue.get_nowait()
                self.dropped += 1
        self.queue.put_nowait(frame)


def frame(topic: str, data: Any) -> bytes:
    return b"event: " + topic.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class Hub:
    def __init__(self, tick: Callable[[Hub], Awaitable[None]], max_streams: dict[str, int] | None = None,
                 per_session: int = 6, queue_size: int = 256, interval_s: float = 1.0) -> None:  # fmt: skip
        self.tick, self.interval_s = tick, interval_s
        # a budget per role: pages opened with client keys never take the streams the admin's pages need
        self.max_streams = max_streams or {"admin": 16, "viewer": 32}
        self.per_session, self.queue_size = per_session, queue_size
        self.clients: set[Client] = set()
        self._ticker: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def open(self, owner: str, topics: set[str], role: str = "viewer") -> Client:
        budget = self.max_streams.get(role, 0)
        if sum(c.role == role for c in self.clients) >= budget:
            raise TooManyStreams(f"the console has {budget} live pages open for the {role} role; close one")
        if sum(c.owner == owner for c in self.clients) >= self.per_session:
            raise TooManyStreams(f"this browser has {self.per_session} live pages open; close one")
        client = Client(owner, topics & TOPICS, self.queue_size)
        client.role = role
        self.clients.add(client)
        self._loop = asyncio.get_running_loop()
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._run(), name="console ticker")
        return client

    def close(self, client: Client) -> None:
        self.clients.discard(client)

    def wants(self, topic: str) -> bool:
        return any(topic in c.topics for c in self.clients)

    def publish(self, topic: str, data: Any) -> None:
        if not self.wants(topic):
            return
        raw = frame(topic, data)
        for client in self.clients:
            if topic in client.topics:
                client.put(raw)

    async def _run(self) -> None:
        while self.clients:
            try:
                await self.tick(self)
            except Exception:  # one bad sample must not end the live pages
                log.exception("console tick failed")
            await asyncio.sleep(self.interval_s)

    def end_streams(self) -> None:
        """Safe from a signal handler: every open stream ends (an empty frame), so that a gateway asked to stop
        does not wait `drain_grace_s` for pages that never finish; the browsers reconnect to the next one."""
        if self._loop is None or self._loop.is_closed():
            return

        def end() -> None:
            for client in list(self.clients):
                client.put(b"")

        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(end)

    async def stop(self) -> None:
        self.clients.clear()
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._ticker
