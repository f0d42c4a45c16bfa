"""413 in OpenAI's shape for request bodies over `gateway.max_body_bytes`, chunked uploads included."""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stack.gateway.metrics import GatewayMetrics
from stack.gateway.openai_errors import envelope


class BodyLimit:
    """413 in OpenAI's shape for bodies over the limit, by Content-Length or while reading chunked ones."""

    def __init__(self, app: ASGIApp, limit: int, metrics: GatewayMetrics | None = None) -> None:
        self.app, self.limit, self.metrics = app, limit, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope["headers"]:
            if name == b"content-length" and (not value.isdigit() or int(value) > self.limit):
                return await self._reject(send)
        if any(name == b"content-length" for name, _ in scope["headers"]):
            return await self.app(scope, receive, send)
        # Chunked upload (no Content-Length): read it here, up to the limit, then replay it.
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, receive, send)
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.limit:
                return await self._reject(send)
            if not message.get("more_body"):
                break
        await self.app(scope, replay(b"".join(chunks), receive), send)

    async def _reject(self, send: Send) -> None:
        if self.metrics is not None:
            self.metrics.rejected.labels("413", "request_too_large").inc()
        body = orjson.dumps(
            envelope(
                f"Request body too large: the limit is {self.limit} bytes.",
                "invalid_request_error",
                None,
                "request_too_large",
            )
        )
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def replay(body: bytes, receive: Receive) -> Receive:
    """`receive` for an app after the body was read here: the body once, then the client's own messages."""
    replayed = False

    async def again() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again
