"""gateway.log_requests: one JSON line per request on the `stack.gateway.requests` logger.

What is logged: time, client address, method, path (never the query string), status, duration, the
deployment that answered and why it was a fallback, and the *name* of the client key. Never a body, a
header value or a key: the line is built from a fixed list of fields, not from the request.
"""

from __future__ import annotations

import logging
import time

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("stack.gateway.requests")


class RequestLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        seen: dict[str, object] = {"status": None}

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                headers = dict(message.get("headers") or [])
                seen["deployment"] = headers.get(b"x-vstack-deployment", b"").decode("latin-1") or None
                seen["fallback"] = headers.get(b"x-vstack-fallback", b"").decode("latin-1") or None
            await send(message)

        failed = False
        try:
            await self.app(scope, receive, watch)
        except Exception:
            failed = True  # a bug of ours, answered 500 by Starlette's outermost handler: not the client's abort
            raise
        finally:
            client = scope.get("client")
            line = {
                "ts": round(time.time(), 3),
                "client": client[0] if client else None,
                "method": scope.get("method"),
                "path": scope.get("path"),
                "status": _status(seen["status"], failed, scope),
                "ms": round((time.perf_counter() - t0) * 1000, 1),
                "deployment": seen.get("deployment"),
                "fallback": seen.get("fallback"),
                "key": (scope.get("state") or {}).get("key_name"),
            }
            log.info(orjson.dumps(line).decode())


def _status(answered: object, failed: bool, scope: Scope) -> object:
    """The status the client saw; 499 when it went away first (stack.gateway.http.client_aborts marks that) or when no
    answer started; 500 when the app failed before answering."""
    if (scope.get("state") or {}).get("client_gone"):
        return 499
    if answered is not None:
        return answered
    return 500 if failed else 499
