"""Finished traces handed to OpenTelemetry's SDK: each record becomes a ReadableSpan with the ids the request
already used (its traceparent went upstream with them) and goes to a BatchSpanProcessor, whose thread sends
them over OTLP (http/protobuf or grpc). Imported only when exporting is on."""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from stack.tracing.record import CLIENT, SERVER, RequestTrace, Span
from stack.tracing.settings import HTTP, Tracing

_KINDS = {SERVER: SpanKind.SERVER, CLIENT: SpanKind.CLIENT}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_OK, _UNSET = Status(StatusCode.OK), Status(StatusCode.UNSET)


def exporter_for(settings: Tracing) -> SpanExporter:
    if settings.protocol == HTTP:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=settings.endpoint, headers=settings.headers or None)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

    insecure = settings.endpoint.startswith("http://")
    return GrpcExporter(endpoint=settings.endpoint, headers=settings.headers or None, insecure=insecure)


class Exporter:
    """What `Tracer.finish` hands sampled traces to."""

    def __init__(self, settings: Tracing, scope: str, exporter: SpanExporter | None = None) -> None:
        self.resource = Resource.create({"service.name": settings.service_name})  # OTEL_RESOURCE_ATTRIBUTES too
        self.scope = InstrumentationScope(scope)
        self.processor = BatchSpanProcessor(exporter or exporter_for(settings))

    def export(self, trace: RequestTrace) -> None:
        for span in trace.spans:
            self.processor.on_end(self._readable(trace, span))

    def _readable(self, trace: RequestTrace, span: Span) -> ReadableSpan:
        context = SpanContext(trace.trace_id, span.span_id, False, _SAMPLED)
        parent = (SpanContext(trace.trace_id, span.parent_id, span.parent_id == trace.remote_parent, _SAMPLED)
                  if span.parent_id else None)  # fmt: skip
        attrs = dict(span.attrs)
        if span.error is not None:
            attrs["error.type"] = span.error
        status = Status(StatusCode.ERROR, span.error) if span.error is not None else _UNSET
        return ReadableSpan(span.name, context, parent, self.resource, attrs,
                            [Event(name, attributes=None, timestamp=at) for name, at in span.events],
                            kind=_KINDS.get(span.kind, SpanKind.INTERNAL), status=status, start_time=span.start,
                            end_time=span.end if span.end is not None else span.start,
                            instrumentation_scope=self.scope)  # fmt: skip

    def flush(self, timeout_s: float = 5) -> bool:
        return self.processor.force_flush(int(timeout_s * 1000))

    def close(self) -> None:
        self.processor.shutdown()
