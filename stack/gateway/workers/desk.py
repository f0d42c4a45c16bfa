"""The owner's side of the worker channel (adr/0049): each `/v1` request a worker relays is decided here by
the one dispatcher (keys, quotas, the manager's ticket and switches, fallbacks, metrics, Activity), and each of
its local attempts is handed back to the worker, which calls the engine and relays the stream itself; the
worker reports how the stream went (its usage, a failure) and the owner counts it as it counts its own.

Messages (stack.gateway.workers.wire), worker -> owner: handle (a request), opened / failed (an attempt's
outcome), progress (an engine's stream moves: liveness), ended (a stream's end), gone (the client left).
Owner -> worker: forward (a check refused it: the owner's route answers it, with its usual error), open (call
this engine; for a stream, the headers to answer with once it opens: the worker starts there), cut (liveness
closed the stream), answer (status and headers of any other answer; the body, unless the worker holds it),
chunk / end (a stream the owner relays itself: a cloud deployment's).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
from starlette.responses import JSONResponse

from stack.gateway.endpoints import ENDPOINTS, Endpoint
from stack.gateway.http.auth import require_caller
from stack.gateway.http.endpoint_routes import checked_body
from stack.gateway.http.error_handlers import count_rejection, error_response
from stack.gateway.http.relay_response import respond
from stack.gateway.http.route_context import GatewayState
from stack.gateway.openai_errors import GatewayError, UpstreamError, envelope
from stack.gateway.routing.answer import SSE_HEADERS, Answer
from stack.gateway.routing.delegation import DELEGATE
from stack.gateway.workers import wire

log = logging.getLogger("stack.gateway")
ROUTES: dict[str, Endpoint] = {p: e for e in ENDPOINTS if e.fast_path for p in e.paths}


class Channel:
    """One worker's connection: messages out, and each request's messages in (a queue per request id)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.queues: dict[int, asyncio.Queue[tuple[dict[str, Any], bytes]]] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}

    def send(self, head: dict[str, Any], data: bytes = b"") -> None:
        if not self.writer.is_closing():
            self.writer.write(wire.frame(head, data))

    async def send_drained(self, head: dict[str, Any], data: bytes = b"") -> None:
        self.send(head, data)
        await self.writer.drain()  # a stream relayed by the owner waits for a slow worker rather than buffering


class Cut:
    """What liveness closes when the engine stops making progress: the worker's upstream connection."""

    def __init__(self, channel: Channel, rid: int, why: Callable[[], str]) -> None:
        self.channel, self.rid, self.why = channel, rid, why

    def close(self) -> None:
        self.channel.send({"op": "cut", "id": self.rid, "why": self.why()})


class WorkerCall:
    """The delegate of one worker request (stack.gateway.routing.delegation): its local attempts made by the worker."""

    def __init__(self, state: GatewayState, channel: Channel, rid: int) -> None:
        self.state, self.channel, self.rid = state, channel, rid
        self.queue = channel.queues[rid]
        self.held = False  # the worker holds the answer's body or stream (a local attempt answered)

    async def attempt(self, at: Any, path: str, payload: bytes, traceparent: str | None, stream: bool,
                      strip_usage: bool) -> Answer:  # fmt: skip
        dep = at.dep
        self.held = False
        # A stream that opens is answered with these headers (the dispatcher returns them unchanged): the worker
        # starts its answer with them at the first chunk, rather than after one more round trip through here.
        early = _headers(respond(Answer({**at.headers, **SSE_HEADERS}, media_type="text/event-stream",
                                        stream=_nothing()))) if stream else None  # fmt: skip
        self.channel.send({"op": "open", "id": self.rid, "dep": dep.id, "url": f"{dep.api_base}{path}",
                           "auth": dep.auth(), "timeout": dep.timeout_s, "traceparent": traceparent,
                           "request_id": at.request_id, "stream": stream, "strip_usage": strip_usage,
                           "headers": early}, payload)  # fmt: skip
        try:
            head, data = await self.queue.get()
        except BaseException:  # liveness gave up on the engine, or the client left: the worker drops the call
            self.channel.send({"op": "cut", "id": self.rid})
            raise
        if head.get("called"):
            at.engine_called(head["called"])
        if head["op"] == "failed":
            raise UpstreamError(head["message"], status=head["status"], retryable=head["retryable"],
                                reason=head["reason"], upstream_body=data or None)  # fmt: skip
        self.held = True
        if not head["stream"]:
            at.answered(head.get("usage"))
            return Answer(at.headers, b"", head["status"], head.get("ctype") or "application/json")
        at.first_token()
        liveness = self.state.dispatcher.liveness
        at.relays(Cut(self.channel, self.rid, lambda: liveness.why(dep.id)))
        return Answer({**at.headers, **SSE_HEADERS}, media_type="text/event-stream", stream=self._ended(at))

    async def _ended(self, at: Any) -> AsyncIterator[bytes]:
        """The stream as the owner sees it: no bytes (the worker relays them), ended when the worker says so."""
        head, _ = await self.queue.get()
        if head.get("usage"):
            at.usage(head["usage"])
        if head.get("failed"):
            at.failed(head["failed"])
        return
        yield b""  # an async generator (the dispatcher closes it as it closes any stream)


class WorkerDesk:
    """The owner's unix socket for its workers, served on the owner's loop."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self.server: asyncio.AbstractServer | None = None

    async def start(self, path: Path) -> None:
        path.unlink(missing_ok=True)
        self.server = await asyncio.start_unix_server(self._connected, str(path))
        os.chmod(path, 0o600)  # the channel trusts whoever connects: the owner's user only

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel = Channel(writer)
        liveness = self.state.dispatcher.liveness
        try:
            while True:
                head, data = await wire.read(reader)
                op, rid = head["op"], head.get("id", 0)
                if op == "handle":
                    channel.queues[rid] = asyncio.Queue()
                    task = asyncio.create_task(self._handle(channel, rid, head, data))
                    channel.tasks[rid] = task
                    task.add_done_callback(lambda _t, rid=rid: _forget(channel, rid))
                elif op == "gone":
                    if (task := channel.tasks.get(rid)) is not None:
                        task.cancel()
                elif op == "progress":
                    liveness.progress(head["dep"])
                elif (queue := channel.queues.get(rid)) is not None:
                    queue.put_nowait((head, data))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the worker ended: what it still had in flight ends as its clients' aborts
        finally:
            for task in list(channel.tasks.values()):
                task.cancel()
            writer.close()

    async def _handle(self, channel: Channel, rid: int, head: dict[str, Any], body: bytes) -> None:
        state, route = self.state, ROUTES[head["path"]]
        try:
            caller = require_caller(state.keys, state.dispatcher.tenants.book, head.get("auth"), head.get("xkey"))
            parsed = orjson.loads(body)
            checked_body(state, route, parsed)
        except (GatewayError, orjson.JSONDecodeError):  # the route answers it, with its error as ever
            channel.send({"op": "forward", "id": rid})
            return
        call = WorkerCall(state, channel, rid)
        DELEGATE.set(call)  # this task's context only
        stream = None
        try:
            answer = await state.dispatcher.handle(route.name, parsed, None, caller, head.get("arrived") or 0.0)
            if call.held and answer.stream is not None:  # the worker answered at its first chunk (the open's headers)
                async for _nothing_relayed in answer.stream:  # ends with the worker's relay; releases what it held
                    pass
                return
            response, stream = respond(answer), answer.stream
        except GatewayError as exc:  # as the route's error handler renders it
            if not isinstance(exc, UpstreamError):
                count_rejection(state.metrics, exc.status, exc.rejection or exc.code or exc.type)
            response = error_response(exc)
        except Exception:  # a bug of ours: logged with its traceback; the client gets no internals
            log.exception("unhandled error in the gateway")
            response = JSONResponse(envelope("internal error in the gateway", "server_error", None, None), 500)
        held = call.held and (stream is not None or response.status_code < 400)
        headers = _headers(response, drop=b"content-length" if held else None)
        channel.send({"op": "answer", "id": rid, "status": response.status_code, "headers": headers, "held": held,
                      "stream": stream is not None}, b"" if held or stream is not None else response.body)  # fmt: skip
        if stream is None:
            return
        async for chunk in stream:  # a delegated stream yields nothing, and ends when the worker's relay ends
            if chunk and not held:
                await channel.send_drained({"op": "chunk", "id": rid}, chunk)
        if not held:
            channel.send({"op": "end", "id": rid})


def _headers(response: Any, drop: bytes | None = None) -> list[list[str]]:
    return [[k.decode("latin-1"), v.decode("latin-1")] for k, v in response.raw_headers if k != drop]


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""


def _forget(channel: Channel, rid: int) -> None:
    channel.tasks.pop(rid, None)
    channel.queues.pop(rid, None)
