"""An ASGI app served by uvicorn in a thread of the test process, on a free loopback port, so a test can
reach its state (registry, manager) directly while talking HTTP to it (uvicorn's own tests do the same)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from bench.harness.waiting import free_port


@dataclass
class Gateway:
    """A gateway app served in a thread: its URL, the app (`state`: what the routes share) and its loop."""

    url: str
    app: object
    loop: asyncio.AbstractEventLoop

    @property
    def state(self):
        return self.app.state.gateway

    def call(self, work, *args, timeout: float = 600):
        """Run `work` on the server's loop and wait for its result: a coroutine (the manager's methods), or
        a plain function and its arguments (the registry, which the loop's thread owns)."""
        if not asyncio.iscoroutine(work):
            fn = work

            async def plain():
                return fn(*args)

            work = plain()
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout)


@contextlib.contextmanager
def app_in_thread(app: object, *, graceful_s: float = 2, start_s: float = 30,
                  join_s: float = 10) -> Iterator[tuple[str, asyncio.AbstractEventLoop]]:  # fmt: skip
    """Yields (base URL, the server's event loop) once uvicorn has started; stops it on exit."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False, timeout_graceful_shutdown=graceful_s))  # fmt: skip
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + start_s
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", loop
    finally:
        server.should_exit = True
        thread.join(join_s)
        loop.close()
