"""One request through the fallback plan: pick a deployment, try it, fall back, answer.

Fallback is possible only until the first byte goes to the client; after that an upstream failure ends
the stream with an error event. Per deployment: a connection refused moves on at once (a dead engine
will not come back within a retry), timeouts and 5xx are retried `num_retries` times with backoff.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson
from starlette.responses import Response, StreamingResponse

from stack.config.sections.gateway import GatewayConfig
from stack.gateway import cloud, local
from stack.gateway.activity import ActivityRing
from stack.gateway.adapters import Adapter, AdapterBook
from stack.gateway.errors import InvalidRequest, NoDeployment, RateLimited, UpstreamError
from stack.gateway.liveness import UNRESPONSIVE, Liveness
from stack.gateway.metrics import GatewayMetrics
from stack.gateway.registry import Deployment
from stack.gateway.replicas import is_replica
from stack.gateway.routing import Routing
from stack.gateway.slo_spill import SpillGuard
from stack.gateway.sse import RelayResponse
from stack.gateway.tasks import PATHS, check_task
from stack.gateway.ttft_estimate import Estimate, Verdict
from stack.manager.errors import ModelUnavailable

USAGE_OPTION = {"chat", "completions"}  # endpoints whose streams take stream_options.include_usage
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass
class Attempt:
    dep: Deployment
    group: str
    fallback_reason: str | None
    started: float
    ticket: Ticket | None = None
    adapter: Adapter | None = None
    endpoint: str = ""
    model: str = ""  # as the client named it (an alias, an adapter)
    ttft_s: float | None = None
    usage: dict | None = None  # a stream's usage, once its last chunk said it
    why: str = ""  # the SLO verdict's reason for going here (stack.gateway.slo_spill), for the Activity log
    estimate: Estimate | None = None  # ... and its TTFT estimate (a non-streamed answer's first token is assumed then)


class Ticket(Protocol):
    def release(self) -> None: ...


class Admission(Protocol):
    """The model manager (stack.manager): waits until the group's model is ready (it may switch models
    meanwhile) and returns a ticket to release when the answer is complete; None: serve it from the
    group's fallbacks while the switch runs."""

    async def admit(self, group: str, can_spill: bool = False) -> Ticket | None: ...

    def expected_switch_s(self, group: str) -> float | None:
        """Seconds until `group`'s model is awake (0: it is; None: unknown)."""


class Dispatcher:
    def __init__(
        self,
        settings: GatewayConfig,
        routing: Routing,
        metrics: GatewayMetrics,
        local_upstream: local.LocalUpstream,
        cloud_upstream: cloud.CloudUpstream,
        admission: Admission | None = None,
    ) -> None:
        self.settings = settings
        self.routing = routing
        self.metrics = metrics
        self.local = local_upstream
        self.cloud = cloud_upstream
        self.in_flight = 0
        self.admission = admission  # the model manager, when the gateway owns engines
        self.adapters: AdapterBook | None = None  # LoRA adapters served on their base model's engine
        # Proof of progress per local engine (stack.gateway.liveness); its probes run in the app's lifespan.
        self.liveness = Liveness(settings.liveness, routing.registry, routing.replicas.outstanding,
                                 metrics.registry)  # fmt: skip
        self.activity = ActivityRing()  # the last requests, for the console (no bodies, no keys)
        self.spill = SpillGuard(settings.spill, metrics.registry)  # TTFT estimates against each model's SLO
        routing.registry.subscribe(self.spill.on_change)

    async def handle(self, endpoint: str, body: dict[str, Any]) -> Response:
        try:  # JSON may carry lone surrogates (\ud800) that no UTF-8 body can: refuse them here, once
            orjson.dumps(body)
        except orjson.JSONEncodeError as exc:
            raise InvalidRequest(f"The request body cannot be forwarded: {exc}. Send valid Unicode text.") from None
        adapter = self.adapters.lookup(str(body["model"])) if self.adapters is not None else None
        group = adapter.base if adapter is not None else self.routing.resolve(body["model"])
        check_task(self.routing.registry, group, endpoint, str(body["model"]))
        if self.in_flight >= self.settings.max_in_flight:
            raise RateLimited(
                "the gateway is at its concurrent request limit; retry shortly", headers={"Retry-After": "1"}
            )
        self.in_flight += 1
        gauge = self.metrics.in_flight.labels(group)
        gauge.inc()
        handed_over = False
        ticket: Ticket | None = None
        started = time.perf_counter()
        try:
            verdict = self._judge(group, body) if adapter is None else None
            slo_spill = verdict is not None and verdict.spill
            if self.admission is not None and not (slo_spill and self.routing.registry.ready(group)):
                ticket = await self._admit(group, verdict)
                slo_spill = slo_spill and ticket is None  # a ticket: the model got ready meanwhile, served here
            try:
                response = await self._route(endpoint, group, body, ticket, spilled=self.admission is not None
                                             and ticket is None, adapter=adapter, verdict=verdict,
                                             slo_spill=slo_spill)  # fmt: skip
            except (UpstreamError, NoDeployment, RateLimited):
                if not slo_spill:
                    raise
                # Its fallbacks failed: the local engines answer after all, late rather than not at all.
                if self.admission is not None:
                    ticket = await self._admit(group)
                late = dataclasses.replace(verdict, why=f"{verdict.why}; the fallbacks failed: answered here")  # type: ignore[arg-type]
                response = await self._route(endpoint, group, body, ticket, verdict=late, local_only=True)
            handed_over = isinstance(response, StreamingResponse)
            return response
        except (UpstreamError, NoDeployment, RateLimited) as err:
            self.metrics.requests.labels(group, "-", str(err.status)).inc()
            self.activity.add(endpoint=endpoint, model=str(body["model"]), deployment="-", route="-",
                              status=str(err.status), started=started)  # fmt: skip
            raise
        except asyncio.CancelledError:  # the client went away before its answer (stack.gateway.aborts)
            self.metrics.requests.labels(group, "-", "499").inc()
            raise
        finally:
            if not handed_over:  # a stream releases its slot when it ends
                self.in_flight -= 1
                gauge.dec()
                if ticket is not None:
                    ticket.release()

    def _judge(self, group: str, body: dict[str, Any]) -> Verdict | None:
        """The SLO verdict for a group with a TTFT objective: its local engines, each with what its switch
        still takes (0 awake; the manager's expectation for one asleep or stopped)."""
        if not self.spill.watches(group):
            return None
        deps = [d for d in self.routing.registry.groups().get(group, []) if d.kind == "local" and d.routable]
        ready = {d.id for d in self.routing.registry.ready(group)}
        switch = (lambda: self.admission.expected_switch_s(group)) if self.admission is not None else (lambda: None)
        engines = [(d, 0.0 if d.id in ready else switch()) for d in deps]
        return self.spill.judge(group, engines, body, has_fallback=len(self.routing.plan(group)) > 1)

    async def _admit(self, group: str, verdict: Verdict | None = None) -> Ticket | None:
        can_spill = len(self.routing.plan(group)) > 1
        if verdict is not None and verdict.reason in ("within_slo", "over_slo"):
            can_spill = verdict.spill  # the switch ends in time: wait for it; or it does not: spill meanwhile
        try:
            return await self.admission.admit(group, can_spill=can_spill)  # type: ignore[union-attr]
        except ModelUnavailable as exc:  # the manager's refusal, rendered here once: 503 + Retry-After
            raise NoDeployment(exc.message, headers={"Retry-After": str(exc.retry_after)}) from None

    def _done(self, group: str, ticket: Ticket | None = None) -> None:
        self.in_flight -= 1
        self.metrics.in_flight.labels(group).dec()
        if ticket is not None:
            ticket.release()

    async def _route(self, endpoint: str, group: str, body: dict[str, Any], ticket: Ticket | None = None,
                     spilled: bool = False, adapter: Adapter | None = None, verdict: Verdict | None = None,
                     slo_spill: bool = False, local_only: bool = False) -> Response:  # fmt: skip
        t0 = time.perf_counter()
        # Spilled before the SLO breaks: straight to the fallbacks, the local engines left to their queue.
        steps = deque(s for s in self.routing.plan(group) if not (slo_spill and s.group == group)
                      and not (local_only and s.group != group))  # fmt: skip
        # An adapter lives on its base model's engines only: no cloud model answers in its name.
        excluded: set[str] = {d.id for d in self.routing.registry.all() if d.kind == "cloud"} if adapter else set()
        fails: dict[str, int] = {}
        last: UpstreamError | None = None
        previous: str | None = None
        last_dep: str | None = None
        while steps:
            step = steps.popleft()
            while (dep := await self.routing.pick(step.group, excluded, body)) is not None:
                # A retry of the deployment that just failed is not a fallback (it stays where it was).
                retry = last_dep is not None and dep.id == last_dep and set(fails) == {dep.id}
                reason = (
                    None if last is None or retry
                    else ("context_window" if step.reason == "context_window" else last.reason)
                )
                if reason is None and slo_spill:
                    reason = "slo"  # its estimated TTFT locally would break the model's objective
                elif reason is None and spilled and step.group != group:
                    reason = "switching"  # the model is being switched in; its fallback serves meanwhile
                if reason is not None and dep.id != last_dep:
                    self.metrics.fallbacks.labels(previous or group, step.group, reason).inc()
                try:
                    return await self._attempt(endpoint, body, Attempt(dep, group, reason, t0, ticket, adapter,
                                                                       endpoint, str(body["model"]),
                                                                       why=verdict.why if verdict else "",
                                                                       estimate=verdict.estimate if verdict else None))
                except UpstreamError as err:
                    self.metrics.upstream_errors.labels(dep.id, err.reason).inc()
                    last, previous, last_dep = err, step.group, dep.id
                    if err.reason == "context_window":
                        bigger = self.routing.context_plan(step.group)
                        if not bigger:
                            raise
                        steps = deque(bigger)
                        break
                    if not err.retryable:
                        raise
                    self.routing.report_failure(dep, err, err.status)
                    fails[dep.id] = fails.get(dep.id, 0) + 1
                    # A replica that failed is not retried while its siblings can take the request.
                    lost_replica = is_replica(dep) and err.reason in ("connect", "error")
                    gone = err.reason in ("connect", "stalled")  # neither comes back within a retry
                    if gone or lost_replica or fails[dep.id] > self.settings.num_retries:
                        excluded.add(dep.id)
                    else:
                        await asyncio.sleep(self.settings.retry_backoff_s * 2 ** (fails[dep.id] - 1))
        retry_after = {"Retry-After": str(self.settings.retry_after_s)}
        if last is not None and last.status == 429:
            raise RateLimited(f"every deployment of `{group}` is rate limited", headers=retry_after)
        deps = self.routing.registry.groups().get(group, [])
        starting = [d.id for d in deps if d.state == "starting"]
        hung = [f"{d.id}: {d.detail}" for d in deps if d.state == UNRESPONSIVE]
        why = f"`{group}` is starting" if starting and last is None else f"no deployment of `{group}` can serve now"
        if hung:  # say why: an engine that stopped making progress (stack.gateway.liveness)
            why += f" (unresponsive engine {'; '.join(hung)})"
        elif last is not None and last.reason == "stalled":
            why += f" ({last.message})"
        raise NoDeployment(f"{why}; retry later", headers=retry_after)

    # -- one attempt ------------------------------------------------------------------------------
    async def _attempt(self, endpoint: str, body: dict[str, Any], at: Attempt) -> Response:
        headers = {"x-vstack-deployment": at.dep.id}
        if at.fallback_reason:
            headers["x-vstack-fallback"] = at.fallback_reason
        if at.dep.kind == "cloud":
            return await self._cloud(endpoint, body, at, headers)
        stream = bool(body.get("stream"))
        out = dict(body, model=at.adapter.name if at.adapter else at.dep.upstream_model)
        if at.adapter is not None and self.adapters is not None:
            await self.adapters.acquire(at.dep, at.adapter)
        try:
            return await self._local(endpoint, out, at, headers, stream)
        except BaseException:
            self._release_adapter(at)
            raise

    def _release_adapter(self, at: Attempt) -> None:
        if at.adapter is not None and self.adapters is not None:
            self.adapters.release(at.adapter)
            at.adapter = None

    async def _local(self, endpoint: str, out: dict[str, Any], at: Attempt, headers: dict[str, str],
                     stream: bool) -> Response:
        strip_usage = False
        if stream and endpoint in USAGE_OPTION:
            opts = dict(out.get("stream_options") or {})
            if not opts.get("include_usage"):
                opts["include_usage"], strip_usage = True, True  # counted by us, dropped before the client
            out["stream_options"] = opts
        book, live, dep_id = self.routing.replicas, self.liveness, at.dep.id
        live.begin(dep_id)
        book.begin(dep_id)  # requests in flight per replica (least_outstanding); ended below or by the stream
        # What is on this engine's plate, for the TTFT estimates of later requests (stack.gateway.engine_load).
        load = self.spill.book
        entry = load.begin(dep_id, out, stream, at.estimate) if self.spill.watches(at.group) else None
        try:
            # Guarded until the answer starts: an engine found unresponsive meanwhile raises EngineStalled,
            # which falls back like any failed attempt (nothing was sent to the client yet).
            async with live.guard(dep_id):
                resp = await self.local.open(at.dep, PATHS[endpoint], orjson.dumps(out))
            if not stream or not resp.content_type.startswith("text/event-stream"):
                async with live.guard(dep_id):
                    raw = await self.local.read(resp, at.dep)
                usage = _usage(raw)
                self._finish(at, "200", usage)
                self._release_adapter(at)
                book.end(dep_id)
                if entry is not None:
                    load.end(entry, usage)
                return Response(raw, resp.status, headers=headers,
                                media_type=resp.content_type or "application/json")  # fmt: skip
            first = await self._first_chunk(resp, dep_id)
        except BaseException:
            book.end(dep_id)
            if entry is not None:
                load.end(entry, None)
            raise
        hooks = self._stream_hooks(at)
        end = hooks["on_end"]
        live.attach(dep_id, resp)
        hooks["on_end"] = lambda cancelled: (live.detach(dep_id, resp), book.end(dep_id), end(cancelled))
        if entry is not None:
            first_hook, end_hook = hooks["on_first"], hooks["on_end"]
            hooks["on_first"] = lambda: (load.first(entry), first_hook())
            hooks["on_end"] = lambda cancelled: (end_hook(cancelled), load.end(entry, at.usage))
        gen = local.relay(resp, strip_usage=strip_usage, first=first, progress=lambda: live.progress(dep_id),
                          stalled=lambda: live.why(dep_id),
                          **{k: v for k, v in hooks.items() if k != "on_end"})  # fmt: skip
        return RelayResponse(
            _closing(gen, hooks["on_end"]), media_type="text/event-stream", headers={**headers, **SSE_HEADERS}
        )

    async def _first_chunk(self, resp: Any, dep_id: str) -> bytes:
        """The stream's first bytes, read before the client gets its 200: until then a stalled or failed
        engine can still fall back."""
        try:
            async with self.liveness.guard(dep_id):
                return await resp.content.readany()
        except (OSError, TimeoutError, aiohttp.ClientError) as exc:
            resp.close()
            raise UpstreamError(f"{dep_id} failed before its first token", status=502, reason="error") from exc
        except BaseException:
            resp.close()
            raise

    async def _cloud(self, endpoint: str, body: dict[str, Any], at: Attempt, headers: dict[str, str]) -> Response:
        result = await self.cloud.call(at.dep, endpoint, body)
        if endpoint in cloud.EVENT_STREAMS and body.get("stream"):
            return await self._cloud_events(endpoint, result, at, headers)
        if not body.get("stream") or endpoint == "embeddings":
            usage = getattr(result, "usage", None)
            self._finish(at, "200", usage.model_dump() if hasattr(usage, "model_dump") else None)
            return Response(cloud.dump(result), 200, headers=headers, media_type="application/json")
        first = await self.cloud.first_chunk(at.dep, result)
        hooks = self._stream_hooks(at)
        gen = cloud.relay(first, result, **{k: v for k, v in hooks.items() if k != "on_end"})
        return RelayResponse(
            _closing(gen, hooks["on_end"]), media_type="text/event-stream", headers={**headers, **SSE_HEADERS}
        )

    async def _cloud_events(self, endpoint: str, result: Any, at: Attempt, headers: dict[str, str]) -> Response:
        """Responses and Anthropic Messages streams from LiteLLM: typed events, relayed as `event:` SSE."""
        first = await self.cloud.first_chunk(at.dep, result)
        hooks = self._stream_hooks(at)
        gen = cloud.relay_events(first, result, **{k: v for k, v in hooks.items() if k != "on_end"})
        return RelayResponse(
            _closing(gen, hooks["on_end"]), media_type="text/event-stream", headers={**headers, **SSE_HEADERS}
        )

    def _stream_hooks(self, at: Attempt) -> dict[str, Any]:
        m, group, dep_id = self.metrics, at.group, at.dep.id
        state = {"status": "200", "usage": None}

        def on_first() -> None:
            at.ttft_s = time.perf_counter() - at.started
            m.ttft.labels(group, dep_id).observe(at.ttft_s)

        def on_usage(usage: dict) -> None:
            state["usage"] = at.usage = usage

        def on_error(kind: str) -> None:
            state["status"] = "stream_error"
            m.upstream_errors.labels(dep_id, "stream").inc()

        def on_end(cancelled: bool) -> None:
            self._finish(at, "499" if cancelled else state["status"], state["usage"])
            self._release_adapter(at)
            self._done(group, at.ticket)

        return {"on_first": on_first, "on_usage": on_usage, "on_error": on_error, "on_end": on_end}

    def _finish(self, at: Attempt, status: str, usage: dict | None) -> None:
        m = self.metrics
        m.requests.labels(at.group, at.dep.id, status).inc()
        m.latency.labels(at.group, at.dep.id).observe(time.perf_counter() - at.started)
        m.usage(at.group, at.dep.id, usage)
        self.activity.add(endpoint=at.endpoint, model=at.model or at.group, deployment=at.dep.id, route=route_of(at),
                          status=status, started=at.started, ttft_s=at.ttft_s, usage=usage, why=at.why)  # fmt: skip


def route_of(at: Attempt) -> str:
    """How the request was answered, as the Activity page shows it."""
    if at.fallback_reason == "switching":
        return "spilled"
    if at.fallback_reason == "slo":
        return "spilled:slo"
    if at.fallback_reason:
        return f"fallback:{at.fallback_reason}"
    if at.dep.kind == "cloud":
        return "cloud"
    return "replica" if is_replica(at.dep) else "local"


async def _closing(gen: Any, on_end: Any) -> Any:
    """Run on_end exactly once however the stream ends (done, failed, or client gone -> cancelled)."""
    cancelled = True
    try:
        async for chunk in gen:
            yield chunk
        cancelled = False
    finally:
        await gen.aclose()
        on_end(cancelled)


def _usage(raw: bytes) -> dict | None:
    if b'"usage"' not in raw:
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    usage = obj.get("usage") if isinstance(obj, dict) else None
    return usage if isinstance(usage, dict) else None
