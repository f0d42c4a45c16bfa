"""One try of one deployment, as an async context manager: what it takes is given back once, however it ends.

Entering takes what the try needs: the LoRA adapter loaded in the engine (stack.gateway.routing.adapters), a
place in the deployment's count of requests in flight (the replica and least-busy choices read it), and, for
a local engine, its liveness watch. Leaving gives all of it back: after an answer read whole, after a failure
the dispatcher falls back from, when a relayed stream ends, or when the client leaves. An attempt that
answered is counted as it ends (vstack_gateway_requests, latency, tokens, the console's Activity ring), with
the status the client saw: 200, `stream_error` (the upstream failed mid-stream), or 499 (the client left).
It is also the relays' listener (stack.gateway.upstreams.listener).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from stack.gateway.metrics import GatewayMetrics
from stack.gateway.registry import Deployment
from stack.gateway.routing.activity import ActivityRing
from stack.gateway.routing.adapters import Adapter, AdapterBook
from stack.gateway.routing.deployment_choice import Routing
from stack.gateway.routing.liveness import Liveness
from stack.gateway.routing.replicas import is_replica
from stack.gateway.routing.slo_spill import SpillGuard
from stack.gateway.routing.ttft_estimate import Verdict
from stack.gateway.tenants.gate import Gate, Quota
from stack.tracing.record import RequestTrace, Span
from stack.tracing.tracer import Tracer


@dataclass
class RoutedRequest:
    endpoint: str
    body: dict[str, Any]
    model: str  # as the client named it (an alias, an adapter)
    group: str
    adapter: Adapter | None
    spilled: bool  # the manager is switching the model in: its fallbacks serve meanwhile
    started: float = 0.0  # when routing began (latency and time to first token count from here)
    arrived: float = 0.0  # when the gateway received it (time.perf_counter: one clock for its worker processes)
    verdict: Verdict | None = None  # its TTFT estimate against the model's SLO (stack.gateway.routing.slo_spill)
    slo_spill: bool = False  # ... which broke it: straight to the fallbacks
    local_only: bool = False  # the fallbacks failed a spilled request: the local engines answer after all
    trace: RequestTrace | None = None  # its spans, when tracing is on (stack.tracing; adr/0042)
    quota: Quota | None = None  # its named key's pass (stack.gateway.tenants.gate)
    tenant: str = ""  # the named key's name, for Activity

    @property
    def quota_spill(self) -> bool:
        """Its key is over a limit and may spill: straight to the fallbacks."""
        return self.quota is not None and bool(self.quota.over_limit)


class Books(Protocol):
    """Where an attempt counts (the dispatcher's own)."""

    metrics: GatewayMetrics
    activity: ActivityRing
    liveness: Liveness
    routing: Routing
    adapters: AdapterBook | None
    spill: SpillGuard
    tracer: Tracer | None
    tenants: Gate


class Attempt:
    def __init__(self, gateway: Books, request: RoutedRequest, dep: Deployment,
                 fallback_reason: str | None) -> None:  # fmt: skip
        self.gateway, self.request, self.dep, self.fallback_reason = gateway, request, dep, fallback_reason
        self.adapter = request.adapter if dep.kind == "local" else None
        self.status: str | None = None  # set once it answered
        self.usage_seen: dict | None = None
        self.ttft_s: float | None = None
        self.called = False  # its engine call counted (vstack_gateway_time_to_engine_call_seconds)
        self.streaming = False
        self.stream_status = "200"
        self._relayed: Any = None  # the local stream being relayed (liveness may cut it)
        self._load: Any = None  # its place in the engine's load, for later TTFT estimates (routing.engine_load)
        self.span: Span | None = None  # its client span, when the request is traced (the dispatcher opens it)
        self._stream_span: Span | None = None
        self.request_id: str | None = None  # sent as X-Request-Id (a disaggregated request's two calls share it)
        self.extra_headers: dict[str, str] = {}  # for the client: x-vstack-prefill (routing.disaggregated)
        self._queued = False  # its prompt's uncached tokens are in its replica's prefill queue (kv_events)

    async def __aenter__(self) -> Attempt:
        gw, dep_id = self.gateway, self.dep.id
        if self.adapter is not None and gw.adapters is not None:
            await gw.adapters.acquire(self.dep, self.adapter)
        if self.dep.kind == "local":
            gw.liveness.begin(dep_id)  # before counting it: an idle engine's silence until now is no stall
        self._queued = gw.routing.replicas.begin(dep_id)  # in its replica's prefill queue until its first token
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:  # fmt: skip
        gw, dep_id = self.gateway, self.dep.id
        if self._relayed is not None:
            gw.liveness.detach(dep_id, self._relayed)
        gw.routing.replicas.end(dep_id, self._queued)
        if self._load is not None:
            gw.spill.book.end(self._load, self.usage_seen)
        if self.streaming:
            self.status = "499" if exc_type is not None else self.stream_status
        if self.span is not None:
            self._end_spans(exc)
        if self.status is not None:
            self._count()
        if self.adapter is not None and gw.adapters is not None:
            gw.adapters.release(self.adapter)

    # -- how it answered ------------------------------------------------------------------------------------
    @property
    def headers(self) -> dict[str, str]:
        headers = {"x-vstack-deployment": self.dep.id, **self.extra_headers}
        if self.fallback_reason:
            headers["x-vstack-fallback"] = self.fallback_reason
        if self.request.trace is not None:  # the client can look its request up (console, collector)
            headers["x-vstack-trace-id"] = self.request.trace.id
        return headers

    def track_load(self, body: dict[str, Any], stream: bool) -> None:
        """Count this local try on its engine's plate, where the model has a TTFT objective (what later
        requests' estimates see ahead of them)."""
        if self.gateway.spill.watches(self.request.group):
            verdict = self.request.verdict
            self._load = self.gateway.spill.book.begin(self.dep.id, body, stream, verdict.estimate if verdict else None)

    def answered(self, usage: dict | None) -> None:
        """A whole answer was read: counted as it ends."""
        self.status, self.usage_seen = "200", usage

    def relays(self, resp: Any = None) -> None:
        """Its answer is a stream, relayed from now on (`resp`: a local engine's, which liveness may cut)."""
        self.streaming = True
        if resp is not None:
            self._relayed = resp
            self.gateway.liveness.attach(self.dep.id, resp)

    def _count(self) -> None:
        gw, req, dep = self.gateway, self.request, self.dep
        m, seconds = gw.metrics, time.perf_counter() - req.started
        m.requests.labels(req.group, dep.id, self.status).inc()
        m.latency.labels(req.group, dep.id).observe(seconds)
        m.usage(req.group, dep.id, self.usage_seen)
        trace = req.trace
        gw.tenants.answered(req.quota, req.group, dep, self.status or "", self.usage_seen)
        rec = gw.activity.add(endpoint=req.endpoint, model=req.model or req.group, deployment=dep.id,
                              route=self.route, status=self.status, started=req.started, ttft_s=self.ttft_s,
                              usage=self.usage_seen, why=req.verdict.why if req.verdict else "",
                              trace_id=trace.id if trace is not None else "", tenant=req.tenant)  # fmt: skip
        gw.routing.answered(dep, seconds, self.usage_seen)
        if trace is not None and gw.tracer is not None:
            trace.activity_id = rec.id
            self._end_root(trace)
            gw.tracer.finish(trace)

    @property
    def route(self) -> str:
        """How the request was answered, as the Activity page shows it."""
        if self.fallback_reason == "switching":
            return "spilled"
        if self.fallback_reason == "slo":
            return "spilled:slo"
        if self.fallback_reason == "quota":
            return "spilled:quota"
        if self.fallback_reason:
            return f"fallback:{self.fallback_reason}"
        if self.dep.kind == "cloud":
            return "cloud"
        return "replica" if is_replica(self.dep) else "local"

    # -- its spans (adr/0042) ------------------------------------------------------------------------------
    def _end_spans(self, exc: BaseException | None) -> None:
        error = None
        if exc is not None:
            error = getattr(exc, "reason", None) or type(exc).__name__
        elif self.status not in (None, "200"):
            error = self.status
        if self._stream_span is not None:
            self._stream_span.close(error=error if self.streaming else None)
        self.span.close(error=error, **self._usage_attrs())  # type: ignore[union-attr]

    def _usage_attrs(self) -> dict[str, Any]:
        usage = self.usage_seen or {}
        tin = usage.get("prompt_tokens", usage.get("input_tokens"))
        tout = usage.get("completion_tokens", usage.get("output_tokens"))
        attrs: dict[str, Any] = {"gen_ai.response.model": self.dep.upstream_model}
        if isinstance(tin, int):
            attrs["gen_ai.usage.input_tokens"] = tin
        if isinstance(tout, int):
            attrs["gen_ai.usage.output_tokens"] = tout
        return attrs

    def _end_root(self, trace: RequestTrace) -> None:
        status = self.status or "200"
        attrs = {**self._usage_attrs(), "vstack.deployment": self.dep.id, "vstack.route": self.route,
                 "http.response.status_code": int(status) if status.isdigit() else 200}
        if self.ttft_s is not None:
            attrs["vstack.ttft_ms"] = round(self.ttft_s * 1000, 3)
        trace.root.close(error=None if status == "200" else status, **attrs)

    # -- the relays' listener -------------------------------------------------------------------------------
    def engine_called(self, at: float) -> None:
        """This attempt's first engine call began at `at` (time.perf_counter, in this process or a worker's); a
        disaggregated attempt's decode call after its prefill's is not counted again."""
        if self.called:
            return
        self.called = True
        arrived = self.request.arrived or self.request.started
        self.gateway.metrics.to_engine.labels(self.request.group, self.dep.id).observe(max(0.0, at - arrived))

    def first_token(self) -> None:
        self.ttft_s = time.perf_counter() - self.request.started
        if self._queued:
            self._queued = False
            self.gateway.routing.replicas.prefilled(self.dep.id)
        if self.span is not None:
            self.span.event("gen_ai.first_token")
            self._stream_span = self.request.trace.span("gateway.stream", parent=self.span)  # type: ignore[union-attr]
        if self._load is not None:
            self.gateway.spill.book.first(self._load)
        self.gateway.metrics.ttft.labels(self.request.group, self.dep.id).observe(self.ttft_s)

    def usage(self, usage: dict) -> None:
        self.usage_seen = usage

    def failed(self, kind: str) -> None:
        self.stream_status = "stream_error"
        self.gateway.metrics.upstream_errors.labels(self.dep.id, "stream").inc()

    def progress(self) -> None:
        self.gateway.liveness.progress(self.dep.id)

    def stalled(self) -> str:
        return self.gateway.liveness.why(self.dep.id)
