"""What routing hands the http room: a whole body, or a stream of SSE bytes relayed as it arrives. The http
room turns it into the HTTP response (stack.gateway.http.relay_response.respond); routing knows no framework."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass
class Answer:
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    status: int = 200
    media_type: str = "application/json"
    # An SSE stream (body and status unused). Its one empty chunk comes after the last byte for the client: the
    # response ends there, and iterating on releases what the request held (its slot, its counts).
    stream: AsyncIterator[bytes] | None = None


async def release_after(stream: AsyncIterator[bytes], held: contextlib.AsyncExitStack) -> AsyncIterator[bytes]:
    """Relay the stream, then give back what its request held, exactly once however it ends (done, failed,
    or the client gone: the attempt hears the exception and counts the client's abort, 499). Once the
    upstream's bytes are all relayed, one empty chunk says so (Answer.stream): the client's answer ends there,
    before the bookkeeping after it."""
    try:
        async for chunk in stream:
            if chunk:
                yield chunk
        yield b""
    except BaseException as exc:
        await stream.aclose()  # type: ignore[attr-defined]
        await held.__aexit__(type(exc), exc, exc.__traceback__)
        raise
    await stream.aclose()  # type: ignore[attr-defined]
    await held.aclose()


def usage_in(raw: bytes) -> dict | None:
    if b'"usage"' not in raw:
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    usage = obj.get("usage") if isinstance(obj, dict) else None
    return usage if isinstance(usage, dict) else None
