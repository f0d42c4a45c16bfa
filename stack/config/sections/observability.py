"""The `observability:` section of the configuration: OpenTelemetry traces of the requests (adr/0042).

A top-level section, not the gateway's: one block turns tracing on for the gateway's own spans, the model
manager's switches, and the engines the stack starts (`vllm serve --otlp-traces-endpoint`). Unset values
fall back on OpenTelemetry's standard environment variables, so a deployment already configured through them
needs only `enabled: true` (stack.tracing.settings resolves them).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TracingConfig(BaseModel):
    """Spans for every request through the gateway and the engines, exported over OTLP to a collector
    (Jaeger, Tempo, an OpenTelemetry Collector); the last requests' spans also kept in memory for the
    console's waterfall, with or without a collector."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool | None = Field(None, description="export spans over OTLP; unset: on exactly when `endpoint` is set")
    endpoint: str | None = Field(
        None,
        description="the collector's OTLP endpoint: http://HOST:4318 (http/protobuf; /v1/traces is added) or "
        "http://HOST:4317 (grpc); unset: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT, then "
        "http://localhost:4318",
    )
    protocol: Literal["http/protobuf", "grpc"] | None = Field(
        None,
        description="OTLP transport; unset: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL, "
        "then http/protobuf",
    )
    sample_ratio: float | None = Field(
        None,
        ge=0,
        le=1,
        description="share of requests exported (a client's sampled traceparent is always "
        "followed); unset: OTEL_TRACES_SAMPLER_ARG, then 1.0",
    )
    headers_env: str | None = Field(
        None,
        description="environment variable holding the exporter's headers (`key=value,key2=value2`, e.g. "
        "a collector's API key); unset: OTEL_EXPORTER_OTLP_TRACES_HEADERS / OTEL_EXPORTER_OTLP_HEADERS",
    )
    service_name: str | None = Field(
        None,
        description="the gateway's service.name (engines get `<name>-engine`); unset: OTEL_SERVICE_NAME, "
        "then vstack-gateway",
    )
    keep: int | None = Field(
        None,
        ge=0,
        le=100_000,
        description="requests whose spans the gateway keeps in memory for the console's "
        "waterfall (0: none); unset: 500 when exporting, else 0 (keeping costs ~0.06 ms of CPU a request)",
    )
    engines: bool = Field(True, description="start the stack's engines with --otlp-traces-endpoint when exporting")

    @model_validator(mode="after")
    def _endpoint_shape(self) -> TracingConfig:
        if self.endpoint is not None and "://" not in self.endpoint:
            raise ValueError(f"endpoint {self.endpoint!r} needs its scheme: http://{self.endpoint}")
        return self


class ObservabilityConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tracing: TracingConfig = Field(default_factory=TracingConfig, description="OpenTelemetry traces (adr/0042)")
