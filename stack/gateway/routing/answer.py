"""What routing hands the http room: a whole body, or a stream of SSE bytes relayed as it arrives. The http
room turns it into the HTTP response (stack.gateway.http.relay_response.respond); routing knows no framework."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

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
