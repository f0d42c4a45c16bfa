"""Cloud deployments: LiteLLM translates the OpenAI request for the provider and back.

LiteLLM is driven through its public API only: its call functions (`litellm.acompletion`, ...,
`litellm.anthropic.messages.acreate`), its exception types and its message check. The provider key is read
from the environment at call time and handed to LiteLLM directly; it never enters a log line or an error
message (messages are scrubbed before they reach the client).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import orjson
from pydantic import ValidationError

from stack.gateway import request_fields
from stack.gateway.endpoints import BY_NAME, ENDPOINTS
from stack.gateway.openai_errors import InvalidBody, UpstreamError, envelope, validation_message
from stack.gateway.registry import Deployment
from stack.gateway.upstreams.listener import StreamListener

_KEYISH = re.compile(r"(sk|pk|rk|key|token)[-_][A-Za-z0-9_\-*]{6,}", re.I)
# LiteLLM's call per endpoint, and the endpoints whose streams are typed events: stack.gateway.endpoints.
_CALLS = {e.name: e.cloud_call for e in ENDPOINTS if e.cloud_call}
EVENT_STREAMS = frozenset(e.name for e in ENDPOINTS if e.event_stream)


def scrub(message: str, secret: str | None) -> str:
    if secret:
        message = message.replace(secret, "[redacted]")
    return _KEYISH.sub("[redacted]", message)[:500]


def classify(dep: Deployment, exc: Exception, secret: str | None) -> UpstreamError:
    import litellm

    status = int(getattr(exc, "status_code", 0) or 0)
    message = scrub(str(getattr(exc, "message", "") or exc), secret)
    if isinstance(exc, litellm.ContextWindowExceededError):
        body = orjson.dumps(envelope(message, "invalid_request_error", "messages", "context_length_exceeded"))
        return UpstreamError(message, status=400, retryable=False, reason="context_window", upstream_body=body)
    fault = _translation_fault(exc, litellm.APIConnectionError)
    if fault is not None:
        # LiteLLM's translation of this request failed before anything was sent (a shape it does not handle),
        # raised bare or wrapped as a connection error (500). The request's fault, not the deployment's: 400,
        # no cooldown.
        text = f"this request could not be translated for {dep.upstream_model} ({fault}); check its fields"
        body = orjson.dumps(envelope(text, "invalid_request_error", None, "unsupported_request"))
        return UpstreamError(text, status=400, retryable=False, reason="client", upstream_body=body)
    if "Unsupported provider" in message:
        # LiteLLM has no such call for this provider (rerank on `openai/...`): raised as a connection error
        # (500) although nothing was sent. The request's fault, not the deployment's: 400, no cooldown.
        text = f"`{dep.model_group}`'s provider has no such endpoint in LiteLLM ({dep.upstream_model})"
        body = orjson.dumps(envelope(text, "invalid_request_error", "model", "unsupported_endpoint"))
        return UpstreamError(text, status=400, retryable=False, reason="client", upstream_body=body)
    if isinstance(exc, litellm.Timeout):
        return UpstreamError(f"{dep.id} timed out", status=504, reason="timeout")
    if isinstance(exc, litellm.APIConnectionError) and status in (0, 500):
        return UpstreamError(f"{dep.id} is not reachable", status=502, reason="connect")
    if status == 429:
        return UpstreamError(f"{dep.id} is rate limited", status=429, reason="rate_limit")
    if status in (401, 403):
        # Our provider key is wrong, not the client's: a deployment failure, said without details.
        return UpstreamError(f"{dep.id} refused our credentials", status=502, reason="auth")
    if 400 <= status < 500:
        body = orjson.dumps(envelope(message, "invalid_request_error", None, None))
        return UpstreamError(message, status=status, retryable=False, reason="client", upstream_body=body)
    return UpstreamError(f"{dep.id} failed ({type(exc).__name__})", status=502, reason="error")


_TRANSLATION_FAULTS = (TypeError, ValueError, KeyError, AttributeError)


def _translation_fault(exc: Exception, wrapper: type[Exception]) -> str | None:
    """The Python error LiteLLM's translation raised, bare or as the cause of its `wrapper` error; else None."""
    if type(exc) in _TRANSLATION_FAULTS:
        return type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, wrapper) and type(cause) in _TRANSLATION_FAULTS:
        return type(cause).__name__
    return None


def quiet_litellm() -> None:
    # Offline: LiteLLM must not fetch its cost map at import; and its INFO logs are per request.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_LOG", "ERROR")


class CloudUpstream:
    def __init__(self, request_timeout_s: float) -> None:
        quiet_litellm()
        self.request_timeout_s = request_timeout_s
        self.after_import: Callable[[], None] = lambda: None  # the app's: what to do once LiteLLM is imported
        self._preloading = False

    def preload_for(self, deployments: Iterable[Deployment]) -> None:
        """Import LiteLLM (~3 s of CPU) on a thread once the gateway serves and a cloud deployment exists: neither
        its start nor a request waits. A gateway of local engines only never imports it: the import holds the GIL
        against the event loop while it runs, and its ~300,000 objects made every full garbage collection longer
        (adr/0031). Called again for each deployment added later (an /admin cloud deployment)."""
        if self._preloading or not any(d.kind == "cloud" for d in deployments):
            return
        self._preloading = True
        threading.Thread(target=self.preload, name="litellm-import", daemon=True).start()

    def preload(self) -> None:
        quiet_litellm()
        import litellm  # noqa: F401

        self.after_import()

    def _kwargs(self, dep: Deployment, endpoint: str, body: dict[str, Any]) -> tuple[str, dict, str | None]:
        params = dict(dep.litellm_params)
        secret = os.environ.get(dep.api_key_env) if dep.api_key_env else None
        # Only the API's own fields, whatever a route let through: a client option (api_base, extra_headers, ...)
        # from the body would redirect our key. An explicit null means "not set" (OpenAI); LiteLLM's adapters
        # fail on some (web_search_options).
        fields = request_fields.only_api_fields(endpoint, body)
        kwargs = {k: v for k, v in fields.items() if k != "model" and v is not None}
        kwargs.update(params)
        kwargs.update(num_retries=0, timeout=dep.timeout_s or self.request_timeout_s)
        if secret:
            kwargs["api_key"] = secret
        return _CALLS[endpoint], kwargs, secret

    async def call(self, dep: Deployment, endpoint: str, body: dict[str, Any],
                   traceparent: str | None = None) -> Any:  # fmt: skip
        """traceparent: the W3C header for the provider (the attempt's span; adr/0042)."""
        import litellm

        try:  # a group of cloud deployments only was checked before routing; a cloud fallback is checked here
            check_api_body(endpoint, body)
        except InvalidBody as exc:  # the provider's refusal, as the attempt handles one: no fallback, 400
            body_json = orjson.dumps(exc.body())
            raise UpstreamError(
                exc.message, status=400, retryable=False, reason="client", upstream_body=body_json
            ) from None

        if endpoint not in _CALLS:
            raise UpstreamError(
                f"{dep.id} is a cloud deployment: it does not serve {endpoint}",
                status=400,
                retryable=False,
                reason="client",
                upstream_body=orjson.dumps(
                    envelope(
                        f"`{dep.model_group}` is served by a cloud provider, which has no {endpoint} endpoint here",
                        "invalid_request_error",
                        "model",
                        "unsupported_endpoint",
                    )
                ),
            )
        fn, kwargs, secret = self._kwargs(dep, endpoint, body)
        if endpoint == "chat":
            _check_messages(dep, kwargs.get("messages"))
        if traceparent is not None:  # never a client's extra_headers (only_api_fields drops them): ours alone
            kwargs["extra_headers"] = {**(kwargs.get("extra_headers") or {}), "traceparent": traceparent}
        call = litellm.anthropic.messages.acreate if fn == "anthropic_messages" else getattr(litellm, fn)
        try:
            return await call(**kwargs)
        except Exception as exc:  # LiteLLM maps every provider failure onto its exception types
            raise classify(dep, exc, secret) from None

    async def first_chunk(self, dep: Deployment, stream: Any) -> Any:
        """Pull the first chunk before answering 200, so an early failure can still fall back."""
        try:
            return await stream.__anext__()
        except StopAsyncIteration:
            return None
        except Exception as exc:
            secret = os.environ.get(dep.api_key_env) if dep.api_key_env else None
            raise classify(dep, exc, secret) from None


def check_api_body(endpoint: str, body: dict[str, Any]) -> None:
    """The body against its public API's model (stack.gateway.schemas), as the API itself would check it: a
    cloud deployment has no vLLM to answer for the fields (a local engine's requests are vLLM's to check,
    adr/0047). A field the API does not define never reaches LiteLLM, whose keywords include client options
    (`api_base`, ...) that would send our provider key elsewhere: refused here, named. Raises InvalidBody."""
    extra = request_fields.unknown(endpoint, body)
    if extra:
        raise InvalidBody(f"Unrecognized request argument supplied: {', '.join(extra)}. `{body.get('model')}` is "
                          f"served by a cloud provider, which takes the fields {BY_NAME[endpoint].path}'s API "
                          "defines; remove it.", param=extra[0])  # fmt: skip
    try:
        BY_NAME[endpoint].api.model_validate(body)
    except ValidationError as exc:
        text, param = validation_message(exc.errors())
        raise InvalidBody(text, param=param) from None


def _check_messages(dep: Deployment, messages: Any) -> None:
    """LiteLLM's own message check, run here so a message it refuses is the client's 400, not a failure of
    the deployment (LiteLLM would raise it wrapped as a connection error, status 500)."""
    from litellm.utils import validate_chat_completion_user_messages

    try:
        validate_chat_completion_user_messages(messages)
    except Exception as exc:  # LiteLLM raises a bare Exception naming the message's index
        text = scrub(str(exc), None)
        body = orjson.dumps(envelope(text, "invalid_request_error", "messages", None))
        raise UpstreamError(text, status=400, retryable=False, reason="client", upstream_body=body) from None


def _heard(chunk: Any, listener: StreamListener, events: bool, strip_usage: bool) -> bool:
    """Hear a chat or completion chunk's usage; False: a chunk that carried only the usage we asked for."""
    if events:
        return True
    usage = getattr(chunk, "usage", None)
    if usage is None:
        return True
    listener.usage(usage.model_dump() if hasattr(usage, "model_dump") else dict(usage))
    if not strip_usage:
        return True
    if not getattr(chunk, "choices", None):
        return False
    chunk.usage = None  # exclude_none drops it from the relayed chunk
    return True


def dump(obj: Any) -> bytes:
    data = obj.model_dump(exclude_none=True) if hasattr(obj, "model_dump") else obj
    return orjson.dumps(data, default=str)


def _chunk_bytes(chunk: Any) -> bytes:
    """One chat or completion chunk as an OpenAI SSE event."""
    return b"data: " + dump(chunk) + b"\n\n"


def _event_bytes(event: Any) -> bytes:
    """One Responses or Anthropic Messages stream event as SSE; LiteLLM yields typed objects or SSE bytes."""
    if isinstance(event, bytes | bytearray):
        return bytes(event) if bytes(event).endswith(b"\n\n") else bytes(event) + b"\n\n"
    if isinstance(event, str):
        return event.encode() if event.endswith("\n\n") else (event + "\n\n").encode()
    data = event.model_dump(exclude_none=True) if hasattr(event, "model_dump") else dict(event)
    kind = data.get("type", "message")
    return b"event: " + str(kind).encode() + b"\ndata: " + orjson.dumps(data, default=str) + b"\n\n"


async def relay(first: Any, stream: Any, listener: StreamListener, *, events: bool,
                strip_usage: bool = False) -> AsyncIterator[bytes]:  # fmt: skip
    """LiteLLM's stream, relayed as the SSE its API defines: chat and completion chunks as `data:` events
    ending in [DONE] (their usage heard), or (`events`) the typed events of the Responses and Anthropic
    Messages APIs. A failure mid-stream ends it with an error event (the status went out already).
    strip_usage: the gateway asked for the usage (its cost counts against budget_usd), the client did not:
    heard, then dropped (a usage-only chunk is not relayed)."""
    frame = _event_bytes if events else _chunk_bytes
    try:
        if first is not None:
            listener.first_token()
            if _heard(first, listener, events, strip_usage):
                yield frame(first)
        async for chunk in stream:
            if _heard(chunk, listener, events, strip_usage):
                yield frame(chunk)
        if not events:
            yield b"data: [DONE]\n\n"
    except Exception as exc:  # mid-stream: the status is sent already; end with an error event
        listener.failed(type(exc).__name__)
        err = envelope("the provider failed while streaming", "server_error", None, "upstream_error")
        yield (b"event: error\ndata: " if events else b"data: ") + orjson.dumps(err) + b"\n\n"
