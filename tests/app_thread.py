"""An ASGI app served by uvicorn in a thread of the test process, on a free loopback port, so a test can
reach its state (registry, manager) directly while talking HTTP to it (uvicorn's own tests do the same)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
