"""observability.tracing resolved against OpenTelemetry's environment variables: what the gateway exports,
where, and what the engines it starts are told (config values first, then the OTEL_* variables, then OTel's
defaults)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from stack.config.sections.observability import TracingConfig
from stack.errors import ConfigError

HTTP = "http/protobuf"
TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class Tracing:
    exporting: bool
    endpoint: str = ""  # what the exporter posts to (http: with /v1/traces)
    protocol: str = HTTP
    ratio: float = 1.0
    headers: dict[str, str] = field(default_factory=dict)
    service_name: str = "vstack-gateway"
    keep: int = 500
    engines: bool = True

    @property
    def engine_service(self) -> str:
        """The engines' service.name: vstack-gateway -> vstack-engine, my-stack -> my-stack-engine."""
        return self.service_name.removesuffix("-gateway") + "-engine"


def resolve(cfg: TracingConfig, environ: Mapping[str, str] | None = None) -> Tracing:
    env = os.environ if environ is None else environ
    exporting = cfg.enabled if cfg.enabled is not None else cfg.endpoint is not None
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true" or env.get("OTEL_TRACES_EXPORTER", "") == "none":
        exporting = False  # OpenTelemetry's own off switches win over the file
    protocol = cfg.protocol or env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    protocol = protocol or HTTP
    if protocol not in (HTTP, "grpc"):
        raise ConfigError(
            f"OTLP protocol {protocol!r} (from the OTEL_EXPORTER_OTLP_*PROTOCOL variable) is not supported",
            hint="set observability.tracing.protocol: http/protobuf or grpc",
        )
    endpoint = cfg.endpoint or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if endpoint is None:  # the generic variable is a base URL: the signal's path is added (OTel's rule)
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or (
            "http://localhost:4318" if protocol == HTTP else "http://localhost:4317"
        )
        endpoint = _traces_url(base) if protocol == HTTP else base
    elif protocol == HTTP:
        endpoint = _traces_url(endpoint)
    ratio = cfg.sample_ratio if cfg.sample_ratio is not None else _ratio(env.get("OTEL_TRACES_SAMPLER_ARG"))
    raw = (
        env.get(cfg.headers_env, "")
        if cfg.headers_env
        else (env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS") or "")
    )
    if cfg.headers_env and cfg.headers_env not in env and exporting:
        raise ConfigError(
            f"observability.tracing.headers_env names {cfg.headers_env}, which is not set",
            hint=f"export {cfg.headers_env}='key=value' or remove headers_env",
        )
    name = cfg.service_name or env.get("OTEL_SERVICE_NAME") or "vstack-gateway"
    keep = cfg.keep if cfg.keep is not None else (500 if exporting else 0)  # measured, not free: adr/0042
    return Tracing(exporting, endpoint, protocol, ratio, _headers(raw), name, keep, cfg.engines)


def _traces_url(base: str) -> str:
    base = base.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def _ratio(text: str | None) -> float:
    try:
        value = float(text) if text else 1.0
    except ValueError:
        raise ConfigError(
            f"OTEL_TRACES_SAMPLER_ARG={text!r} is not a number",
            hint="set it to a ratio between 0 and 1, or set observability.tracing.sample_ratio",
        ) from None
    return min(1.0, max(0.0, value))


def _headers(raw: str) -> dict[str, str]:
    """OTel's `key=value,key2=value2` (values URL-encoded)."""
    from urllib.parse import unquote

    out = {}
    for part in raw.split(","):
        key, sep, value = part.partition("=")
        if sep and key.strip():
            out[key.strip().lower()] = unquote(value.strip())
    return out
