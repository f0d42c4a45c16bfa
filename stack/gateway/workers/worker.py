"""A gateway worker process (adr/0049): accepts on the public port beside its siblings, relays the plain `/v1`
POSTs itself (the HTTP work and every streamed byte: what grows with tokens), and hands the rest to the owner.

Per plain request (the fast path's test: a JSON body within the limit, no Origin; its schema checked here), the
owner decides over the worker channel (stack.gateway.workers.desk) and names the engine to call; the worker
calls it, relays the stream to its client, then tells the owner how it ended. Everything else (admin, the
console, /metrics, /v1/models, a request a check refuses) goes to the owner's HTTP server on its unix socket,
byte for byte, with the client's address in `x-vstack-peer` (the owner listens nowhere else). Responses carry
`x-vstack-worker: N`, the process that served them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import logging
import signal
import socket
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from stack.config.sections.gateway import GatewayConfig
from stack.gateway.http.body_limit import replay
from stack.gateway.http.cross_site import CrossSiteGuard, HostNames
from stack.gateway.http.openai_fast_path import _plain_headers, _read_body, _text
from stack.gateway.http.relay_response import until_the_client_leaves
from stack.gateway.openai_errors import UpstreamError, envelope
from stack.gateway.routing.answer import usage_in
from stack.gateway.upstreams import fast_path
from stack.gateway.upstreams.fast_path import LocalUpstream
from stack.gateway.workers import wire
from stack.gateway.workers.desk import ROUTES

log = logging.getLogger("stack.gateway")
HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"upgrade", b"x-vstack-peer"}
OWNERS = HOP | {b"date", b"server"}  # the owner's response headers uvicorn writes again here
PROGRESS_EVERY_S = 0.5  # an engine's streams moving, told the owner's liveness at most this often per worker


@dataclass
class Engine:
    """The deployment as LocalUpstream needs it: the owner named it in its `open`."""

    id: str
    api_base: str
    timeout_s: float | None
    headers: dict[str, str]

    def auth(self) -> dict[str, str]:
        return self.headers


class OwnerLink:
    """The worker's end of the channel: a queue per request id; the link lost ends the worker."""

    def __init__(self, path: str, on_lost: Any) -> None:
        self.path, self.on_lost = path, on_lost
        self.queues: dict[int, asyncio.Queue[tuple[dict[str, Any], bytes]]] = {}
        self.ids = itertools.count(1)
        self.writer: asyncio.StreamWriter | None = None
        self.progressed: dict[str, float] = {}

    async def connect(self) -> None:
        reader, self.writer = await asyncio.open_unix_connection(self.path)
        asyncio.get_running_loop().create_task(self._read(reader), name="owner link")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                head, data = await wire.read(reader)
                if (queue := self.queues.get(head.get("id", 0))) is not None:
                    queue.put_nowait((head, data))
        except (asyncio.IncompleteReadError, ConnectionError):
            log.error("worker: the owner's channel closed; this worker stops")
            self.on_lost()

    def open(self) -> tuple[int, asyncio.Queue[tuple[dict[str, Any], bytes]]]:
        rid = next(self.ids)
        queue = self.queues[rid] = asyncio.Queue()
        return rid, queue

    def send(self, head: dict[str, Any], data: bytes = b"") -> None:
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(wire.frame(head, data))

    def progress(self, dep: str) -> None:
        now = time.monotonic()
        if now - self.progressed.get(dep, 0.0) >= PROGRESS_EVERY_S:
            self.progressed[dep] = now
            self.send({"op": "progress", "dep": dep})


class Relayed:
    """The worker relay's listener (stack.gateway.upstreams.listener): what the owner is told at the end."""

    def __init__(self, link: OwnerLink, dep: str) -> None:
        self.link, self.dep = link, dep
        self.usage_seen: dict | None = None
        self.failed_kind: str | None = None
        self.cut = ""

    def first_token(self) -> None:
        pass  # the owner counted it when the first chunk was read (before the answer's headers)

    def usage(self, usage: dict) -> None:
        self.usage_seen = usage

    def failed(self, kind: str) -> None:
        self.failed_kind = kind

    def progress(self) -> None:
        self.link.progress(self.dep)

    def stalled(self) -> str:
        return self.cut


class WorkerApp:
    def __init__(self, settings: GatewayConfig, index: int, desk_path: str, http_path: str) -> None:
        self.settings, self.index = settings, str(index).encode()
        self.desk_path, self.http_path = desk_path, http_path
        self.link: OwnerLink | None = None
        self.local = LocalUpstream(settings.connect_timeout_s, settings.request_timeout_s)
        self.owner: aiohttp.ClientSession | None = None
        self.server: Any = None  # the uvicorn server, told to exit when the owner's channel is lost

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if scope["type"] != "http":
            return None  # no websocket route in the gateway
        route = ROUTES.get(scope["path"]) if scope["method"] == "POST" else None
        headers = _plain_headers(scope, self.settings.max_body_bytes) if route is not None else None
        if route is None or headers is None:
            return await self.proxy(scope, receive, send)
        arrived = time.perf_counter()  # the owner's clock too (CLOCK_MONOTONIC): its time-to-engine-call metric
        body, gone = await _read_body(receive)
        if gone:
            return None
        try:
            route.reads.model_validate(orjson.loads(body))
        except (orjson.JSONDecodeError, ValidationError):
            return await self.proxy(scope, replay(body, receive), send)
        if not await self.relay(scope, receive, send, headers, body, arrived):
            await self.proxy(scope, replay(body, receive), send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.link = OwnerLink(self.desk_path, self._lost)
                await self.link.connect()
                await self.local.start()
                self.owner = aiohttp.ClientSession(
                    connector=aiohttp.UnixConnector(path=self.http_path), auto_decompress=False,
                    timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
                    skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"))  # fmt: skip
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.local.close()
                if self.owner is not None:
                    await self.owner.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _lost(self) -> None:
        if self.server is not None:
            self.server.should_exit = True

    async def relay(self, scope: Scope, receive: Receive, send: Send, headers: dict[bytes, bytes],
                    body: bytes, arrived: float = 0.0) -> bool:  # fmt: skip
        """Serve one plain request with the owner's decision; False: the owner forwards it to its route."""
        link = self.link
        assert link is not None
        rid, queue = link.open()
        link.send({"op": "handle", "id": rid, "path": scope["path"], "auth": _text(headers.get(b"authorization")),
                   "xkey": _text(headers.get(b"x-api-key")), "arrived": arrived}, body)  # fmt: skip
        resp, held, first, listener, strip = None, b"", b"", None, False
        finished = forward = False
        try:
            async with until_the_client_leaves(receive) as done:
                while True:
                    head, data = await queue.get()
                    op = head["op"]
                    if op == "forward":
                        forward = True
                        break
                    if op == "open":
                        if resp is not None:
                            resp.close()
                        resp, reply, held, first = await self._open(rid, head, data)
                        listener, strip = Relayed(link, head["dep"]), head["strip_usage"]
                        link.send(reply, b"" if resp is not None else held)
                        if resp is not None:  # a stream opened: answered now, with the headers its `open` gave
                            await self._stream(send, resp, listener, strip, first, head["headers"], done, rid, queue)
                            finished = True
                            break
                    elif op == "cut":
                        if listener is not None:
                            listener.cut = head.get("why") or "the engine stopped making progress"
                        if resp is not None:
                            resp.close()
                    elif op == "answer":
                        out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in head["headers"]]
                        out.append((b"x-vstack-worker", self.index))
                        if head["held"] and not head["stream"]:
                            out.append((b"content-length", str(len(held)).encode()))
                        await send({"type": "http.response.start", "status": head["status"], "headers": out})
                        if not head["stream"]:
                            done()
                            await send({"type": "http.response.body", "body": held if head["held"] else data})
                        else:
                            while (msg := await queue.get())[0]["op"] == "chunk":
                                await send({"type": "http.response.body", "body": msg[1], "more_body": True})
                            done()
                            await send({"type": "http.response.body", "body": b"", "more_body": False})
                        finished = True
                        break
        finally:
            if not finished and not forward:  # the client left (or the worker is stopping): the owner counts 499
                link.send({"op": "gone", "id": rid})
            if resp is not None:
                resp.close()
            link.queues.pop(rid, None)
        return not forward

    async def _stream(self, send: Send, resp: Any, listener: Relayed, strip: bool, first: bytes,
                      headers: list[list[str]], done: Any, rid: int, queue: asyncio.Queue) -> None:  # fmt: skip
        """The engine's stream answered with the owner's `headers` and relayed to the client, then its end told to
        the owner. Meanwhile the owner's liveness may cut it (the engine stalled): the connection is closed and
        the relay ends the stream with the reason, as one process does."""
        out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers] + [(b"x-vstack-worker", self.index)]
        await send({"type": "http.response.start", "status": 200, "headers": out})
        watch = asyncio.get_running_loop().create_task(_cut_when_told(queue, resp, listener))
        try:
            async for chunk in fast_path.relay(resp, listener, strip_usage=strip, first=first):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            watch.cancel()
        done()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        assert self.link is not None
        self.link.send({"op": "ended", "id": rid, "usage": listener.usage_seen, "failed": listener.failed_kind})

    async def _open(self, rid: int, head: dict[str, Any], payload: bytes) -> tuple[Any, dict[str, Any], bytes, bytes]:
        """(the engine's streaming response or None, the reply to the owner, a whole body read, the first chunk)."""
        engine = Engine(head["dep"], head["url"], head.get("timeout"), head.get("auth") or {})
        called = time.perf_counter()  # told to the owner with the outcome: its time-to-engine-call metric
        try:
            resp = await self.local.open(engine, "", payload, head.get("traceparent"), head.get("request_id"))
            if head["stream"] and resp.content_type.startswith("text/event-stream"):
                try:
                    first = await resp.content.readany()
                except (OSError, TimeoutError, aiohttp.ClientError) as exc:
                    resp.close()
                    raise UpstreamError(f"{engine.id} failed before its first token", status=502,
                                        reason="error") from exc  # fmt: skip
                return resp, {"op": "opened", "id": rid, "stream": True, "called": called}, b"", first
            raw = await self.local.read(resp, engine)
        except UpstreamError as exc:
            reply = {"op": "failed", "id": rid, "message": exc.message, "status": exc.status, "reason": exc.reason,
                     "retryable": exc.retryable, "called": called}  # fmt: skip
            return None, reply, exc.upstream_body or b"", b""
        reply = {"op": "opened", "id": rid, "stream": False, "status": resp.status, "usage": usage_in(raw),
                 "ctype": resp.content_type, "called": called}  # fmt: skip
        return None, reply, raw, b""

    async def proxy(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The request as the owner's own HTTP server answers it, relayed both ways."""
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"] if k not in HOP]
        client = scope.get("client")
        if client:
            headers.append(("x-vstack-peer", f"{client[0]}:{client[1]}"))
        query = scope.get("query_string", b"")
        url = f"http://owner{scope['path']}" + (f"?{query.decode('latin-1')}" if query else "")
        assert self.owner is not None
        async with until_the_client_leaves(receive) as done:
            try:
                resp = await self.owner.request(scope["method"], url, data=b"".join(chunks), headers=headers,
                                                allow_redirects=False)  # fmt: skip
            except aiohttp.ClientError:
                body = orjson.dumps(envelope("the gateway's owner process is not answering; retry shortly",
                                             "server_error", None, "owner_unavailable"))  # fmt: skip
                await send(
                    {
                        "type": "http.response.start",
                        "status": 503,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
            try:
                out = [(k, v) for k, v in resp.raw_headers if k.lower() not in OWNERS]
                if resp.headers.get("content-length") is not None:
                    out.append((b"content-length", resp.headers["content-length"].encode()))
                out.append((b"x-vstack-worker", self.index))
                await send({"type": "http.response.start", "status": resp.status, "headers": out})
                async for chunk in resp.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                done()
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                resp.close()


async def _cut_when_told(queue: asyncio.Queue, resp: Any, listener: Relayed) -> None:
    """The owner's `cut` for a stream being relayed: its reason kept, the engine's connection closed."""
    while True:
        head, _ = await queue.get()
        if head["op"] == "cut":
            listener.cut = head.get("why") or "the engine stopped making progress"
            resp.close()
            return


def bind(host: str, port: int, listen: bool) -> socket.socket:
    """A socket on the public port with SO_REUSEPORT: each worker listens on its own, and the kernel spreads new
    connections evenly among them (a shared socket lets whichever process wakes first take them all). The owner
    binds one without listening: it holds the port (a port in use fails it before anything starts), and a socket
    that does not listen is given no connection."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(2048)  # uvicorn's default backlog
    return sock


def die_with_parent() -> None:
    """Linux: the kernel ends this worker when the owner dies, however it dies (no orphan holds the port)."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the lost channel ends it instead (OwnerLink)
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def run_worker(index: int, settings_json: str, host: str, port: int, desk_path: str, http_path: str,
               open_api: bool, log_level: str) -> None:  # fmt: skip
    """The worker process's main (multiprocessing, spawn): serve `sock` until SIGTERM, draining as the owner does."""
    die_with_parent()
    from stack.gateway.http.serve import GatewayServer, uvicorn_config

    sock = bind(host, port, listen=True)

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s worker {index} %(levelname)s %(message)s")
    settings = GatewayConfig.model_validate_json(settings_json)
    app = WorkerApp(settings, index, desk_path, http_path)
    guarded = CrossSiteGuard(app, names=HostNames(settings.host, settings.allowed_hosts), open_api=open_api)
    config = uvicorn_config(guarded, settings.host, 0, settings.drain_grace_s, log_level, limits=settings)  # type: ignore[arg-type]
    server = GatewayServer(config)
    app.server = server
    server.run(sockets=[sock])
