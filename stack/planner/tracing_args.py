"""observability.tracing for the engines the stack starts: vLLM's `--otlp-traces-endpoint`, and the variables
its exporter reads (protocol, service name, headers), so that an engine's spans join the gateway's trace
(the gateway sends each request's W3C traceparent; adr/0042)."""

from __future__ import annotations

from urllib.parse import quote

from stack.config.resolve import ResolvedProfile
from stack.config.schema import StackConfig
from stack.tracing.settings import resolve
from stack.vllm.options import VllmCatalog

OPTION = "otlp_traces_endpoint"
HEADERS_ENV = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"


def apply_tracing(cfg: StackConfig, resolved: ResolvedProfile, catalog: VllmCatalog, notes: list[str]) -> None:
    """When the gateway exports traces, the engine exports its own to the same collector; a profile that sets
    otlp_traces_endpoint itself keeps it."""
    settings = resolve(cfg.observability.tracing)
    if not settings.exporting or not settings.engines or OPTION in resolved.engine:
        return
    if OPTION not in catalog:
        notes.append(
            f"tracing: this vLLM ({catalog.version}) has no --otlp-traces-endpoint: the engine's own "
            "spans are missing from the traces"
        )
        return
    resolved.engine[OPTION] = settings.endpoint
    resolved.engine_origins[OPTION] = "observability.tracing: the engine's spans join the gateway's traces"
    # vLLM picks its exporter from this variable (grpc when unset) and posts to the endpoint as given.
    resolved.env.setdefault("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", settings.protocol)
    resolved.env.setdefault("OTEL_SERVICE_NAME", settings.engine_service)
    if settings.headers:
        resolved.env.setdefault(HEADERS_ENV, ",".join(f"{k}={quote(v, safe='')}" for k, v in settings.headers.items()))
    notes.append(f"tracing: the engine exports its spans to {settings.endpoint} ({settings.protocol})")
