"""One request through its fallback plan: admit it, pick a deployment, try it, fall back, answer.

Fallback is possible only until the first byte goes to the client; after that an upstream failure ends the
stream with an error event. Per deployment: a connection refused moves on at once (a dead engine will not
come back within a retry), timeouts and 5xx are retried `num_retries` times with backoff. What a request
holds (its place under `max_in_flight`, the manager's ticket, its winning attempt: stack.gateway.routing.attempt)
is kept in one exit stack, given back when the answer is complete: at once for a whole body, when the
stream ends for a stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol

import aiohttp
import orjson

from stack.config.sections.gateway import GatewayConfig
from stack.gateway.endpoints import BY_NAME
from stack.gateway.metrics import GatewayMetrics
from stack.gateway.openai_errors import GatewayError, InvalidRequest, NoDeployment, RateLimited, UpstreamError
from stack.gateway.routing.activity import ActivityRing
from stack.gateway.routing.adapters import Adapter, AdapterBook
from stack.gateway.routing.answer import SSE_HEADERS, Answer, release_after, usage_in
from stack.gateway.routing.attempt import Attempt, RoutedRequest
from stack.gateway.routing.delegation import DELEGATE
from stack.gateway.routing.deployment_choice import Routing
from stack.gateway.routing.disaggregated import is_decode, prefill_first
from stack.gateway.routing.liveness import UNRESPONSIVE, Liveness
from stack.gateway.routing.model_tasks import check_task
from stack.gateway.routing.replicas import is_replica
from stack.gateway.routing.request_spans import attempt_span, request_attrs, switch_attrs
from stack.gateway.routing.slo_spill import SpillGuard
from stack.gateway.routing.ttft_estimate import Verdict
from stack.gateway.tenants.gate import Caller, Gate
from stack.gateway.upstreams import cloud_client, fast_path
from stack.manager.unavailable import ModelUnavailable
from stack.tracing.record import RequestTrace
from stack.tracing.tracer import Tracer


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
        local_upstream: fast_path.LocalUpstream,
        cloud_upstream: cloud_client.CloudUpstream,
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
        # Proof of progress per local engine (stack.gateway.routing.liveness); its probes run in the app's lifespan.
        self.liveness = Liveness(settings.liveness, routing.registry, routing.replicas.outstanding,
                                 metrics.registry)  # fmt: skip
        self.activity = ActivityRing()  # the last requests, for the console (no bodies, no keys)
        self.spill = SpillGuard(settings.spill, metrics.registry)  # TTFT estimates against each model's SLO
        self.tenants = Gate(settings.admission, metrics.registry)  # named keys: limits, fair admission, usage
        routing.registry.subscribe(self.spill.on_change)
        self.tracer: Tracer | None = None  # the request's spans (stack.tracing; adr/0042); None: no tracing call

    def trace(self, endpoint: str, start: int, traceparent: str | None) -> RequestTrace | None:
        """A request's trace, begun at `start` (the entry's clock), or None when tracing is off."""
        if self.tracer is None:
            return None
        entry = BY_NAME[endpoint]
        return self.tracer.start(f"POST {entry.path}", start, traceparent, **{
            "http.request.method": "POST", "http.route": entry.path,
            "gen_ai.operation.name": entry.operation or endpoint})  # fmt: skip

    async def handle(
        self, endpoint: str, body: dict[str, Any], trace: RequestTrace | None = None, caller: Caller | None = None,
        arrived: float = 0.0,
    ) -> Answer:
        """trace: the request's spans (self.trace), finished here however the request ends; caller: who sent it
        (its named key's limits, class and usage: stack.gateway.tenants); arrived: when the gateway received it
        (time.perf_counter; 0: now), for vstack_gateway_time_to_engine_call_seconds."""
        if trace is None:
            return await self._handle(endpoint, body, None, caller, arrived)
        try:
            return await self._handle(endpoint, body, trace, caller, arrived)
        except BaseException as exc:
            if trace.root.end is None:  # not ended by an attempt: refused, failed or the client gone here
                status = 499 if isinstance(exc, asyncio.CancelledError) else getattr(exc, "status", 500)
                trace.root.close(error=getattr(exc, "reason", None) or type(exc).__name__,
                                 **{"http.response.status_code": status})  # fmt: skip
                self.tracer.finish(trace)  # type: ignore[union-attr]
            raise

    async def _handle(
        self, endpoint: str, body: dict[str, Any], trace: RequestTrace | None, caller: Caller | None, arrived: float
    ) -> Answer:
        started, model = time.perf_counter(), str(body.get("model", "-"))
        arrived = arrived or started
        who = caller.tenant.name if caller is not None and caller.tenant is not None else ""
        try:
            adapter, group = self._admissible(endpoint, body, model)
            quota = self.tenants.check(caller, endpoint, body, model, group, len(self.routing.plan(group)) > 1)
        except GatewayError as err:  # refused before routing (unknown model, wrong task, at the limit): shown too
            rec = self.activity.add(endpoint=endpoint, model=model, deployment="-", route="refused", tenant=who,
                                    status=str(err.status), started=started, why=err.code or err.type,
                                    trace_id=trace.id if trace is not None else "")  # fmt: skip
            if trace is not None:
                trace.activity_id = rec.id
            err.in_activity = True
            raise
        if trace is not None:
            request_attrs(trace, body, model, group)
        async with contextlib.AsyncExitStack() as held:
            held.enter_context(self._slot(group))
            held.callback(quota.release)
            try:
                verdict = self._judge(group, body, trace) if adapter is None and not quota.over_limit else None
                slo_spill, ticket = verdict is not None and verdict.spill, None
                if not slo_spill and not quota.over_limit and self._has_local(group):
                    await held.enter_async_context(self.tenants.place(group, quota))  # its turn for the engines
                if (self.admission is not None and not quota.over_limit
                        and not (slo_spill and self.routing.registry.ready(group))):  # fmt: skip
                    ticket = await self._admit(group, verdict, trace)
                    slo_spill = slo_spill and ticket is None  # a ticket: the model got ready meanwhile, served here
                if ticket is not None:
                    held.callback(ticket.release)
                request = RoutedRequest(endpoint, body, model, group, adapter, verdict=verdict, slo_spill=slo_spill,
                                        spilled=self.admission is not None and ticket is None and not quota.over_limit,
                                        quota=quota, tenant=who, trace=trace, arrived=arrived)  # fmt: skip
                try:
                    answer = await self._route(request, held)
                except (UpstreamError, NoDeployment, RateLimited):
                    if not slo_spill:
                        raise
                    # Its fallbacks failed: the local engines answer after all, late rather than not at all.
                    ticket = await self._admit(group, trace=trace) if self.admission is not None else None
                    if ticket is not None:
                        held.callback(ticket.release)
                    late = dataclasses.replace(verdict, why=f"{verdict.why}; the fallbacks failed: answered here")  # type: ignore[arg-type]
                    request = RoutedRequest(endpoint, body, model, group, adapter, spilled=False, verdict=late,
                                            local_only=True, quota=quota, tenant=who, trace=trace,
                                            arrived=arrived)  # fmt: skip
                    answer = await self._route(request, held)
            except (UpstreamError, NoDeployment, RateLimited) as err:
                self.metrics.requests.labels(group, "-", str(err.status)).inc()
                self.tenants.failed(quota, group)
                rec = self.activity.add(endpoint=endpoint, model=model, deployment="-", route="-", tenant=who,
                                        status=str(err.status), started=started, why=err.code or "",
                                        trace_id=trace.id if trace is not None else "")  # fmt: skip
                if trace is not None:
                    trace.activity_id = rec.id
                err.in_activity = True
                raise
            except asyncio.CancelledError:  # the client went away before its answer (stack.gateway.http.client_aborts)
                self.metrics.requests.labels(group, "-", "499").inc()
                raise
            if answer.stream is not None:  # what the request holds is given back when the stream ends
                answer.stream = release_after(answer.stream, held.pop_all())
            return answer

    def _admissible(self, endpoint: str, body: dict[str, Any], model: str) -> tuple[Adapter | None, str]:
        """(its adapter, its model group) for a request the gateway may route; else the GatewayError why not."""
        try:  # JSON may carry lone surrogates (\ud800) that no UTF-8 body can: refuse them here, once
            orjson.dumps(body)
        except orjson.JSONEncodeError as exc:
            raise InvalidRequest(f"The request body cannot be forwarded: {exc}. Send valid Unicode text.") from None
        adapter = self.adapters.lookup(model) if self.adapters is not None else None
        group = adapter.base if adapter is not None else self.routing.resolve(body["model"])
        check_task(self.routing.registry, group, endpoint, model)
        deps = self.routing.registry.groups().get(group, [])
        if deps and all(d.kind == "cloud" for d in deps):  # no vLLM to check the fields: the API's model does
            cloud_client.check_api_body(endpoint, body)
        if self.in_flight >= self.settings.max_in_flight:
            raise RateLimited(
                "the gateway is at its concurrent request limit; retry shortly", headers={"Retry-After": "1"}
            )
        return adapter, group

    @contextlib.contextmanager
    def _slot(self, group: str) -> Iterator[None]:
        """The request's place under `max_in_flight` (and in the in-flight gauge)."""
        gauge = self.metrics.in_flight.labels(group)
        self.in_flight += 1
        gauge.inc()
        try:
            yield
        finally:
            self.in_flight -= 1
            gauge.dec()

    def _has_local(self, group: str) -> bool:
        """Whether the group has local engines: the admission queue stands in front of those only."""
        return self.tenants.admission is not None and any(
            d.kind == "local" for d in self.routing.registry.groups().get(group, [])
        )

    def _judge(self, group: str, body: dict[str, Any], trace: RequestTrace | None = None) -> Verdict | None:
        """The SLO verdict for a group with a TTFT objective: its local engines, each with what its switch
        still takes (0 awake; the manager's expectation for one asleep or stopped)."""
        if not self.spill.watches(group):
            return None
        if trace is not None:
            span = trace.span("gateway.spill_decision")
            verdict = self._verdict(group, body)
            if verdict is not None:
                est = verdict.estimate
                span.close(
                    **{
                        "vstack.spill": verdict.spill,
                        "vstack.spill.reason": verdict.reason,
                        "vstack.spill.why": verdict.why,
                        **({"vstack.spill.estimate_s": est.seconds} if est is not None else {}),
                    }
                )
            else:
                span.close()
            return verdict
        return self._verdict(group, body)

    def _verdict(self, group: str, body: dict[str, Any]) -> Verdict | None:
        deps = [d for d in self.routing.registry.groups().get(group, []) if d.kind == "local" and d.routable]
        ready = {d.id for d in self.routing.registry.ready(group)}
        switch = (lambda: self.admission.expected_switch_s(group)) if self.admission is not None else (lambda: None)
        engines = [(d, 0.0 if d.id in ready else switch()) for d in deps]
        return self.spill.judge(group, engines, body, has_fallback=len(self.routing.plan(group)) > 1)

    async def _admit(self, group: str, verdict: Verdict | None = None,
                     trace: RequestTrace | None = None) -> Ticket | None:  # fmt: skip
        can_spill = len(self.routing.plan(group)) > 1 or self._bridged(group)
        if verdict is not None and verdict.reason in ("within_slo", "over_slo"):
            can_spill = verdict.spill  # the switch ends in time: wait for it; or it does not: spill meanwhile
        span = None
        if trace is not None:
            expected = self.admission.expected_switch_s(group)  # type: ignore[union-attr]
            span = trace.span("gateway.admission", **{"vstack.model_group": group, "vstack.can_spill": can_spill,
                                                       "vstack.switch.expected_s": -1.0 if expected is None
                                                       else float(expected)})  # fmt: skip
        try:
            ticket = await self.admission.admit(group, can_spill=can_spill)  # type: ignore[union-attr]
        except ModelUnavailable as exc:  # the manager's refusal, rendered here once: 503 + Retry-After
            if span is not None:
                span.close(error="unavailable")
            raise NoDeployment(exc.message, headers={"Retry-After": str(exc.retry_after)}) from None
        except BaseException:
            if span is not None:
                span.close(error="cancelled")
            raise
        if span is not None:
            span.close(**{"vstack.admitted": ticket is not None, **switch_attrs(self.admission, group, span.start)})
        return ticket

    def _bridged(self, group: str) -> bool:
        """A bridge (a ready deployment of the group itself added at runtime: `vstack upgrade apply`) serves the
        group while its own engine drains and restarts, as a fallback would."""
        return any(d.labels.get("added") == "admin" for d in self.routing.registry.ready(group))

    async def _route(self, request: RoutedRequest, held: contextlib.AsyncExitStack) -> Answer:
        group, request.started = request.group, time.perf_counter()
        # Spilled before the SLO breaks: straight to the fallbacks, the local engines left to their queue.
        steps = deque(s for s in self.routing.plan(group)
                      if not ((request.slo_spill or request.quota_spill) and s.group == group)
                      and not (request.local_only and s.group != group))  # fmt: skip
        # An adapter lives on its base model's engines only: no cloud model answers in its name.
        excluded: set[str] = ({d.id for d in self.routing.registry.all() if d.kind == "cloud"}
                              if request.adapter else set())  # fmt: skip
        if request.spilled and self._bridged(group):  # its own engine is draining or restarting: no ticket holds it
            excluded |= {
                d.id for d in self.routing.registry.all() if d.model_group == group and d.labels.get("managed") == "1"
            }
        fails: dict[str, int] = {}
        last: UpstreamError | None = None
        previous: str | None = None
        last_dep: str | None = None
        tokens = await self.routing.replicas.prompt_tokens(group, request.body)  # kv_events routing only
        while steps:
            step = steps.popleft()
            while (dep := self.routing.pick(step.group, excluded, request.body,
                                            tokens if step.group == group else None)) is not None:  # fmt: skip
                # A retry of the deployment that just failed is not a fallback (it stays where it was).
                retry = last_dep is not None and dep.id == last_dep and set(fails) == {dep.id}
                reason = (
                    None
                    if last is None or retry
                    else ("context_window" if step.reason == "context_window" else last.reason)
                )
                if reason is None and request.quota_spill:
                    reason = "quota"  # its key is over a limit and may spill (stack.gateway.tenants)
                elif reason is None and request.slo_spill:
                    reason = "slo"  # its estimated TTFT locally would break the model's objective
                elif reason is None and request.spilled and step.group != group:
                    reason = "switching"  # the model is being switched in; its fallback serves meanwhile
                if reason is not None and dep.id != last_dep:
                    self.metrics.fallbacks.labels(previous or group, step.group, reason).inc()
                try:
                    async with contextlib.AsyncExitStack() as attempt_held:
                        attempt = await attempt_held.enter_async_context(Attempt(self, request, dep, reason))
                        if request.trace is not None:
                            attempt.span = attempt_span(request, dep, reason, retry, sum(fails.values()) + 1)
                        answer = await self._try(attempt)
                        if answer.stream is not None:
                            held.push_async_exit(attempt_held.pop_all())  # it ends with its stream
                        return answer
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
                    self.routing.report_failure(dep, err.status)
                    fails[dep.id] = fails.get(dep.id, 0) + 1
                    # A replica that failed is not retried while its siblings can take the request.
                    lost_replica = is_replica(dep) and err.reason in ("connect", "error")
                    gone = err.reason in ("connect", "stalled")  # neither comes back within a retry
                    if gone or lost_replica or fails[dep.id] > self.settings.num_retries:
                        excluded.add(dep.id)
                    else:
                        wait = request.trace.span("gateway.retry_backoff") if request.trace is not None else None
                        await asyncio.sleep(self.settings.retry_backoff_s * 2 ** (fails[dep.id] - 1))
                        if wait is not None:
                            wait.close()
        raise self._nothing_serves(group, last)

    def _nothing_serves(self, group: str, last: UpstreamError | None) -> RateLimited | NoDeployment:
        retry_after = {"Retry-After": str(self.settings.retry_after_s)}
        if last is not None and last.status == 429:
            return RateLimited(f"every deployment of `{group}` is rate limited", headers=retry_after)
        deps = self.routing.registry.groups().get(group, [])
        starting = [d.id for d in deps if d.state == "starting"]
        hung = [f"{d.id}: {d.detail}" for d in deps if d.state == UNRESPONSIVE]
        why = f"`{group}` is starting" if starting and last is None else f"no deployment of `{group}` can serve now"
        if hung:  # say why: an engine that stopped making progress (stack.gateway.routing.liveness)
            why += f" (unresponsive engine {'; '.join(hung)})"
        elif last is not None and last.reason == "stalled":
            why += f" ({last.message})"
        return NoDeployment(f"{why}; retry later", headers=retry_after)

    # -- one attempt ------------------------------------------------------------------------------
    async def _try(self, at: Attempt) -> Answer:
        if at.dep.kind == "cloud":
            return await self._cloud(at)
        return await self._local(at)

    async def _local(self, at: Attempt) -> Answer:
        req, dep_id, live = at.request, at.dep.id, self.liveness
        out = dict(req.body, model=at.adapter.name if at.adapter else at.dep.upstream_model)
        if at.dep.labels.get("scheduling") == "priority":  # the engine orders its queue by it: ours, never the client's
            out["priority"] = req.quota.priority if req.quota is not None else 0
        stream, strip_usage = bool(req.body.get("stream")), False
        if stream and BY_NAME[req.endpoint].usage_option:
            opts = dict(out.get("stream_options") or {})
            if not opts.get("include_usage"):
                opts["include_usage"], strip_usage = True, True  # counted by us, dropped before the client
            out["stream_options"] = opts
        if is_decode(at.dep):  # a disaggregated model: its prompt's KV computed on a prefill engine first
            out = await prefill_first(self, at, BY_NAME[req.endpoint].upstream_path, out)
        at.track_load(out, stream)
        # Guarded until the answer starts: an engine found unresponsive meanwhile raises EngineStalled, which
        # falls back like any failed attempt (nothing was sent to the client yet).
        parent = req.trace.traceparent(at.span) if at.span is not None else None  # type: ignore[union-attr]
        if (delegate := DELEGATE.get()) is not None:  # a worker's request: the worker calls the engine (adr/0049)
            async with live.guard(dep_id):
                path = BY_NAME[req.endpoint].upstream_path
                return await delegate.attempt(at, path, orjson.dumps(out), parent, stream, strip_usage)
        async with live.guard(dep_id):
            at.engine_called(time.perf_counter())
            resp = await self.local.open(at.dep, BY_NAME[req.endpoint].upstream_path, orjson.dumps(out), parent,
                                         request_id=at.request_id)  # fmt: skip
        if not stream or not resp.content_type.startswith("text/event-stream"):
            async with live.guard(dep_id):
                raw = await self.local.read(resp, at.dep)
            at.answered(usage_in(raw))
            return Answer(at.headers, raw, resp.status, resp.content_type or "application/json")
        first = await self._first_chunk(resp, dep_id)
        at.relays(resp)
        gen = fast_path.relay(resp, at, strip_usage=strip_usage, first=first)
        return Answer({**at.headers, **SSE_HEADERS}, media_type="text/event-stream", stream=gen)

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

    async def _cloud(self, at: Attempt) -> Answer:
        req = at.request
        parent = req.trace.traceparent(at.span) if at.span is not None else None  # type: ignore[union-attr]
        entry = BY_NAME[req.endpoint]
        body, strip_usage = req.body, False
        if req.body.get("stream") and entry.usage_option:
            opts = dict(req.body.get("stream_options") or {})
            if not opts.get("include_usage"):  # a stream's cost counts too (budget_usd): asked, dropped after
                body, strip_usage = dict(req.body, stream_options={**opts, "include_usage": True}), True
        result = await self.cloud.call(at.dep, req.endpoint, body, parent)
        if not req.body.get("stream") or not entry.streams:
            usage = getattr(result, "usage", None)
            at.answered(usage.model_dump() if hasattr(usage, "model_dump") else None)
            return Answer(at.headers, cloud_client.dump(result))
        first = await self.cloud.first_chunk(at.dep, result)
        at.relays()
        gen = cloud_client.relay(first, result, at, events=entry.event_stream, strip_usage=strip_usage)
        return Answer({**at.headers, **SSE_HEADERS}, media_type="text/event-stream", stream=gen)
