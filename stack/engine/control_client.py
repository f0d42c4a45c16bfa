"""One HTTP client per process for the calls that drive engines: health, sleep, wake, collective_rpc.

httpx builds an SSL context (the CA bundle read and parsed) for every `Client`, and `httpx.get`/`httpx.post`
make a new one per call: ~50 ms of CPU on a 2-core VM, paid three or four times per model switch (sleep, wake,
health) although the engine answers on loopback within a millisecond. One client, its connections kept alive,
serves every thread of the manager (httpx's Client can be shared between threads).
"""

from __future__ import annotations

import threading

import httpx

_lock = threading.Lock()
_client: httpx.Client | None = None


def control_client() -> httpx.Client:
    """The process's client for engine control calls (each call passes its own timeout)."""
    global _client
    if _client is None:
        with _lock:
            if _client is None:
                # An idle connection is dropped after 1 s, well before the engine's server closes it (uvicorn's
                # keep-alive timeout, 5 s): a POST /sleep never goes out on a connection the server is closing.
                _client = httpx.Client(timeout=10.0, limits=httpx.Limits(keepalive_expiry=1.0))
    return _client
