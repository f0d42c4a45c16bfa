"""The local fast path: a local engine's HTTP response streamed to the client byte for byte.

No LiteLLM in the byte path (adr/0006): one pooled aiohttp connection per in-flight request, the
engine's SSE events forwarded as they arrive. The only event we look into is the final usage event
(to count tokens); when the client did not ask for usage, we asked for it on its behalf and drop it.
Closing the upstream response on client disconnect makes vLLM abort the request.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import aiohttp
import orjson

from stack.gateway.openai_errors import UpstreamError, envelope
from stack.gateway.registry import Deployment
from stack.gateway.upstreams.listener import StreamListener

# vLLM names the parameter of a request it refuses (VLLMValidationError.parameter, its error's `param`): a
# prompt longer than the model's context is `input_tokens` (or `input_text`, before tokenizing; 0.32).
CONTEXT_PARAMS = frozenset({"input_tokens", "input_text"})
# Only for an error that names no parameter (vLLM before structured errors, 0.26 on the GPU machine): its text,
# "This model's maximum context length is N tokens ...", "max_tokens=N cannot be greater than max_model_len=M".
CONTEXT_RE = re.compile(
    rb"maximum context length|context length is|greater than max_model_len|prompt is too long|input is too long", re.I
)


def context_too_long(body: bytes) -> bool:
    """Whether an engine's 400 says the prompt does not fit the model's context: from the error's `param` where
    vLLM gives one, from its text only where it gives none."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        error = None
    param = error.get("param") if isinstance(error, dict) else None
    if param is not None:
        return param in CONTEXT_PARAMS
    return CONTEXT_RE.search(body) is not None


def classify(dep: Deployment, status: int, body: bytes) -> UpstreamError:
    """An engine's error answer -> fall back (5xx, 429) or hand to the client (4xx)."""
    if status == 429:
        return UpstreamError(f"{dep.id} is rate limited", status=429, reason="rate_limit", upstream_body=body)
    if status >= 500:
        return UpstreamError(f"{dep.id} answered {status}", status=502, reason="error")
    if status == 400 and context_too_long(body):
        return UpstreamError(
            "context too long", status=400, retryable=False, reason="context_window", upstream_body=body
        )
    return UpstreamError(
        f"{dep.id} rejected the request",
        status=status,
        retryable=False,
        reason="client",
        upstream_body=openai_shaped(status, body),
    )


def openai_shaped(status: int, body: bytes) -> bytes:
    """An engine's 4xx as OpenAI's error JSON. vLLM's own errors are already (Anthropic Messages errors carry
    `error` too); a framework default such as `{"detail": "Not Found"}` for a route the engine does not
    mount is rewritten, keeping its status and its words."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        return body
    detail = obj.get("detail") if isinstance(obj, dict) else None
    text = (
        detail
        if isinstance(detail, str)
        else (orjson.dumps(detail).decode() if detail else body.decode(errors="replace")[:500])
    )
    if status == 404 and text == "Not Found":
        text = "The model's engine does not serve this endpoint."
    kinds = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
    return orjson.dumps(
        envelope(
            text or f"the engine answered {status}",
            kinds.get(status, "invalid_request_error"),
            None,
            "unsupported_endpoint" if status == 404 else None,
        )
    )


class LocalUpstream:
    def __init__(self, connect_timeout_s: float, request_timeout_s: float) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # limit=0: the gateway's own max_in_flight bounds concurrency, not a pool size.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:  # created in the app's lifespan; tests without one get it lazily
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        return self._session

    async def open(self, dep: Deployment, path: str, payload: bytes, traceparent: str | None = None,
                   request_id: str | None = None) -> aiohttp.ClientResponse:  # fmt: skip
        """traceparent: the W3C header vLLM continues the trace from (the attempt's span; adr/0042); request_id:
        vLLM's X-Request-Id (a disaggregated request's prefill and decode calls share one, adr/0052)."""
        timeout = aiohttp.ClientTimeout(
            total=dep.timeout_s or self.request_timeout_s, connect=self.connect_timeout_s, sock_read=None
        )
        headers = {"Content-Type": "application/json", **dep.auth()}
        if traceparent is not None:
            headers["traceparent"] = traceparent
        if request_id is not None:
            headers["X-Request-Id"] = request_id
        try:
            resp = await self.session.post(
                f"{dep.api_base}{path}",
                data=payload,
                headers=headers,
                timeout=timeout,
            )
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, ConnectionError) as exc:
            raise UpstreamError(f"{dep.id} is not reachable", status=502, reason="connect") from exc
        except TimeoutError as exc:
            raise UpstreamError(f"{dep.id} timed out", status=504, reason="timeout") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"{dep.id} failed: {type(exc).__name__}", status=502, reason="error") from exc
        if resp.status >= 400:
            body = await _read(resp)
            raise classify(dep, resp.status, body)
        return resp

    async def read(self, resp: aiohttp.ClientResponse, dep: Deployment) -> bytes:
        try:
            body = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            resp.close()
            raise UpstreamError(f"{dep.id} failed while answering", status=502, reason="error") from exc
        except BaseException:  # cancelled (the client went away): drop the connection, so vLLM aborts it
            resp.close()
            raise
        resp.release()
        return body


async def _read(resp: aiohttp.ClientResponse) -> bytes:
    try:
        return await resp.read()
    except (aiohttp.ClientError, TimeoutError):
        return b""
    finally:
        resp.release()


def _usage_of(event: bytes) -> tuple[dict | None, bool]:
    """(usage, is_usage_only_event) for one SSE event."""
    if not event.startswith(b"data: {"):
        return None, False
    try:
        obj = orjson.loads(event[6:])
    except orjson.JSONDecodeError:
        return None, False
    usage = obj.get("usage") if isinstance(obj, dict) else None
    return (usage if isinstance(usage, dict) else None), not obj.get("choices")


async def relay(
    resp: aiohttp.ClientResponse, listener: StreamListener, *, strip_usage: bool, first: bytes = b""
) -> AsyncIterator[bytes]:
    """Forward SSE bytes (`first`: those read already); pick out usage; on a failure mid-stream, end with an
    error event. The listener hears every chunk (its liveness), the first, the usage and a failure, and says
    why the engine was found unresponsive when that is what closed the stream."""
    pending = b""
    started = False
    try:
        while chunk := first or await resp.content.readany():
            first = b""
            listener.progress()
            if not started:
                started = True
                listener.first_token()
            # Fast path: whole events without usage go out untouched.
            if not pending and b'"usage"' not in chunk and chunk.endswith(b"\n\n"):
                yield chunk
                continue
            events = (pending + chunk).split(b"\n\n")
            pending = events.pop()
            out = []
            for event in events:
                if b'"usage"' in event:
                    usage, usage_only = _usage_of(event)
                    if usage:
                        listener.usage(usage)
                    if usage_only and strip_usage:
                        continue
                out.append(event + b"\n\n")
            if out:
                yield b"".join(out)
        if pending:
            yield pending
        why = listener.stalled()
        if why:  # cut by the liveness watch (the closed connection read as an end)
            raise aiohttp.ClientConnectionError(why)
        resp.release()
    except (aiohttp.ClientError, TimeoutError, asyncio.IncompleteReadError) as exc:
        listener.failed(type(exc).__name__)
        why = listener.stalled()
        message = (
            f"the engine stopped making progress ({why}); the stream was ended"
            if why
            else "the model server failed while streaming"
        )
        err = envelope(message, "server_error", None, "engine_stalled" if why else "upstream_error")
        yield b"data: " + orjson.dumps(err) + b"\n\n"
    finally:
        # Client gone (cancelled) or done: closing drops the connection, so vLLM aborts what is left.
        resp.close()
