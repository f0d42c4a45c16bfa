"""Per-connection deadlines, so a client that trickles its headers or body cannot hold a connection open.

uvicorn bounds only the idle time between requests (timeout_keep_alive), and not even before the first
one. Its httptools protocol is subclassed here with two deadlines, each a total (not reset by each byte,
which is what a slowloris client exploits):
- headers: from the connection's start (or the next request's first byte) to the end of the headers;
- body: from the end of the headers to the end of the body.
Past one, the client gets `408 Request Timeout` if no answer has started, and the connection is closed.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
               b"content-length: %d\r\n\r\n%s")  # fmt: skip
BODY = (b'{"error":{"message":"The request took too long to arrive; the connection is closed.",'
        b'"type":"invalid_request_error","param":null,"code":"request_timeout"}}')


class _Guarded(HttpToolsProtocol):
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    _deadline: asyncio.TimerHandle | None = None
    _headers_pending = True  # waiting for a request's headers (a previous cycle may be long answered)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport is None or self.transport.is_closing():
            return
        if self._headers_pending or (self.cycle is not None and not self.cycle.response_started):
            self.transport.write(TIMEOUT_408 % (len(BODY), BODY))
        self.transport.close()  # the app's receive() then sees http.disconnect

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout_s)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._headers_pending = True
        if self._deadline is None:  # the next request on a kept-alive connection
            self._arm(self.header_timeout_s)

    def on_headers_complete(self) -> None:
        self._headers_pending = False
        super().on_headers_complete()
        self._arm(self.body_timeout_s)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def guarded_protocol(header_timeout_s: float, body_timeout_s: float) -> type[HttpToolsProtocol]:
    """The httptools protocol with these deadlines (a class per setting: uvicorn instantiates it itself)."""
    return type("SlowClientGuard", (_Guarded,), {"header_timeout_s": header_timeout_s,
                                                 "body_timeout_s": body_timeout_s})  # fmt: skip
