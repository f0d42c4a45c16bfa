"""POST of the endpoints whose entry says `fast_path` (stack.gateway.endpoints: /v1/chat/completions,
/v1/completions, /v1/embeddings) without the framework's layers, for the requests that need none of them
(issue 37, item 4; adr/0032).

A plain request (a JSON body with a Content-Length within the limit, no browser Origin) is checked here as its
FastAPI route would check it: the client key, the body's schema (the entry's pydantic model), the gateway's
limits (`checked_body`, the very function the route calls). Then the dispatcher routes it and its answer is
written with two ASGI sends, the client's disconnect heard by one watcher task that cancels the request (the
attempt counts it 499, the upstream connection is closed, the engine aborts). Every check that fails, and every
request that is not plain, goes to the FastAPI route instead, the body replayed: errors keep their one place and
shape (stack.gateway.http.error_handlers), and only the dispatcher's own errors are rendered here, by the same
functions. What this saves per request: FastAPI's dependency resolution and request objects, three ASGI
middlewares' wrappers and tasks, and Starlette's response classes (bench/gateway_timeline.py).
"""

from __future__ import annotations

import logging
import time

import orjson
from pydantic import ValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from stack.gateway.endpoints import ENDPOINTS, Endpoint
from stack.gateway.http.auth import require_caller
from stack.gateway.http.body_limit import replay
from stack.gateway.http.endpoint_routes import checked_body
from stack.gateway.http.error_handlers import count_rejection, error_response
from stack.gateway.http.relay_response import respond, send_stream, until_the_client_leaves
from stack.gateway.http.route_context import GatewayState
from stack.gateway.openai_errors import GatewayError, UpstreamError, envelope
from stack.gateway.tenants.gate import Caller
from stack.tracing.record import RequestTrace, clock

log = logging.getLogger("stack.gateway")
ROUTES: dict[str, Endpoint] = {p: e for e in ENDPOINTS if e.fast_path for p in e.paths}
JSON_TYPES = (b"application/json", b"application/json; charset=utf-8")


class OpenAIFastPath:
    """ASGI middleware: the plain requests of the three POST routes, served here; everything else passes on."""

    def __init__(self, app: ASGIApp, state: GatewayState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = ROUTES.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        headers = _plain_headers(scope, self.state.settings.max_body_bytes) if route is not None else None
        if route is None or headers is None:
            return await self.app(scope, receive, send)
        dispatcher = self.state.dispatcher
        arrived = time.perf_counter()  # for vstack_gateway_time_to_engine_call_seconds
        entered = clock() if dispatcher.tracer is not None else 0  # tracing off: not even the clock (adr/0042)
        body, gone = await _read_body(receive)
        if gone:
            scope.setdefault("state", {})["client_gone"] = True
            return None
        checked = self._check(route, headers, body)
        if checked is None:  # refused by a check: the route answers it as it always has
            return await self.app(scope, replay(body, receive), send)
        scope.setdefault("state", {})["key_name"] = checked[1].key_name
        trace = None
        if entered:
            trace = dispatcher.trace(route.name, entered, _text(headers.get(b"traceparent")))
            trace.span("gateway.receive", start=entered).close(**{"vstack.key_name": checked[1].key_name or "-"})  # type: ignore[union-attr]
        await self._serve(scope, receive, send, route.name, checked[0], checked[1], trace, arrived)

    def _check(self, route: Endpoint, headers: dict[bytes, bytes], body: bytes) -> tuple[dict, Caller] | None:
        """(the parsed body, who sent it), or None where a check refuses the request."""
        try:
            name = require_caller(self.state.keys, self.state.dispatcher.tenants.book,
                                  _text(headers.get(b"authorization")), _text(headers.get(b"x-api-key")))  # fmt: skip
            parsed = orjson.loads(body)
            route.reads.model_validate(parsed)
            checked_body(self.state, route, parsed)  # the route's own checks, the same function
        except (GatewayError, orjson.JSONDecodeError, ValidationError):
            return None
        return parsed, name

    async def _serve(self, scope: Scope, receive: Receive, send: Send, endpoint: str, body: dict,
                     caller: Caller, trace: RequestTrace | None = None, arrived: float = 0.0) -> None:  # fmt: skip
        def gone() -> None:
            scope["state"]["client_gone"] = True

        async with until_the_client_leaves(receive, gone) as done:
            stream = None
            try:
                answer = await self.state.dispatcher.handle(endpoint, body, trace, caller, arrived)
                response, stream = respond(answer), answer.stream
            except GatewayError as exc:  # as the route's error handler renders it
                if not isinstance(exc, UpstreamError):
                    count_rejection(self.state.metrics, exc.status, exc.rejection or exc.code or exc.type)
                response = error_response(exc)
            except Exception:  # a bug of ours: logged with its traceback; the client gets no internals
                log.exception("unhandled error in the gateway")
                response = JSONResponse(envelope("internal error in the gateway", "server_error", None, None), 500)
            # The headers Starlette's response computed (its content type and length rules), sent here directly.
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": response.raw_headers})  # fmt: skip
            if stream is None:
                done()
                await send({"type": "http.response.body", "body": response.body})
            else:
                await send_stream(stream, send, ended=done)


def _plain_headers(scope: Scope, limit: int) -> dict[bytes, bytes] | None:
    """The request's headers where it is plain: a JSON body whose Content-Length is within the limit, no
    Origin (a browser's request: CORS answers it). Else None."""
    headers: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        headers.setdefault(name, value)  # the first of repeated headers, as Starlette's request reads them
    length = headers.get(b"content-length")
    if length is None or not length.isdigit() or int(length) > limit or b"origin" in headers:
        return None
    kind = headers.get(b"content-type")
    if kind is None or kind.lower() not in JSON_TYPES:
        return None
    return headers


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """(the body, whether the client left before sending all of it)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"", True
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks), False


def _text(value: bytes | None) -> str | None:
    return value.decode("latin-1") if value is not None else None
