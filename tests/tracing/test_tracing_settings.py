"""observability.tracing: the OTel environment variables honoured under the config file, the engines' argv and
environment when the gateway exports, and the console's bounded buffer of traces (stack.tracing; adr/0042)."""

from __future__ import annotations

import pytest

from stack.config import load_config
from stack.config.sections.observability import TracingConfig
from stack.errors import ConfigError
from stack.hardware import detect
from stack.planner.model_planner import plan_model
from stack.tracing.record import RequestTrace, clock
from stack.tracing.settings import resolve
from stack.tracing.tracer import TraceBuffer, tracer_for
from tests.conftest import load_catalog


def test_off_by_default_and_on_with_one_endpoint() -> None:
    off = resolve(TracingConfig(), environ={})
    assert not off.exporting and off.keep == 0 and tracer_for(off) is None  # off: no tracer, no tracing call
    kept = resolve(TracingConfig(keep=200), environ={})  # the console's waterfall alone, without a collector
    assert not kept.exporting and kept.keep == 200
    on = resolve(TracingConfig(endpoint="http://collector:4318"), environ={})
    assert on.exporting and on.endpoint == "http://collector:4318/v1/traces" and on.protocol == "http/protobuf"
    assert on.ratio == 1.0 and on.service_name == "vstack-gateway" and on.engine_service == "vstack-engine"
    assert on.keep == 500  # exporting: the console keeps the last requests too
    grpc = resolve(TracingConfig(endpoint="http://collector:4317", protocol="grpc"), environ={})
    assert grpc.endpoint == "http://collector:4317"  # grpc takes the address as given


def test_the_otel_variables_fill_what_the_file_leaves_unset() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://tempo:4318/",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
        "OTEL_SERVICE_NAME": "edge-gateway",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=abc%20d,tenant=t1",
    }
    got = resolve(TracingConfig(enabled=True), environ=env)
    assert got.exporting and got.endpoint == "http://tempo:4318/v1/traces" and got.ratio == 0.25
    assert got.service_name == "edge-gateway" and got.engine_service == "edge-engine"
    assert got.headers == {"x-api-key": "abc d", "tenant": "t1"}
    # the file wins over the variables; OTel's own off switch wins over the file
    assert resolve(TracingConfig(enabled=True, sample_ratio=1.0), environ=env).ratio == 1.0
    assert not resolve(TracingConfig(endpoint="http://c:4318"), environ={"OTEL_SDK_DISABLED": "true"}).exporting
    named = TracingConfig(headers_env="MY_OTLP", endpoint="http://c:4318")
    assert resolve(named, environ={"MY_OTLP": "authorization=Bearer%20k"}).headers == {"authorization": "Bearer k"}


def test_a_headers_variable_that_is_not_set_is_named_with_the_fix() -> None:
    with pytest.raises(ConfigError) as err:
        resolve(TracingConfig(endpoint="http://c:4318", headers_env="MY_OTLP_HEADERS"), environ={})
    assert "MY_OTLP_HEADERS" in err.value.message and "export MY_OTLP_HEADERS" in err.value.hint
    with pytest.raises(ValueError, match="needs its scheme: http://collector:4318"):
        TracingConfig(endpoint="collector:4318")


def test_engines_export_to_the_same_collector_when_the_gateway_does(monkeypatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    cfg = load_config(overrides={"observability": {"tracing": {"endpoint": "http://collector:4318"}}})
    plan = plan_model(cfg, None, detect(), load_catalog("0.32"), for_launch=False)
    assert "--otlp-traces-endpoint http://collector:4318/v1/traces" in plan.display()
    assert plan.env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"  # vLLM's default would be grpc
    assert plan.env["OTEL_SERVICE_NAME"] == "vstack-engine"
    assert "observability.tracing" in plan.engine_origins["otlp_traces_endpoint"]
    plain = plan_model(load_config(), None, detect(), load_catalog("0.32"), for_launch=False)
    assert "otlp" not in plain.display() and "OTEL_SERVICE_NAME" not in plain.env
    assert plain.fingerprint != plan.fingerprint  # a kept engine without tracing is not reused for one with it


def test_the_buffer_keeps_the_last_traces_by_trace_and_by_request_id() -> None:
    buffer = TraceBuffer(2)
    traces = []
    for n in (1, 2, 3):
        trace = RequestTrace("POST /v1/chat/completions", clock(), 1.0)
        trace.activity_id = n
        buffer.add(trace)
        traces.append(trace)
    assert len(buffer) == 2 and buffer.get("1") is None and buffer.get(traces[0].id) is None
    assert buffer.get("3")["trace_id"] == traces[2].id and buffer.get(traces[1].id.upper())["activity_id"] == 2


def test_a_ratio_of_zero_is_not_sampled_but_still_kept_for_the_console() -> None:
    tracer = tracer_for(resolve(TracingConfig(keep=500), environ={}))
    assert tracer is not None and tracer.exporter is None  # the SDK is not even imported for it
    trace = tracer.start("POST /v1/completions", clock())
    attempt = trace.span("completion m")
    assert trace.traceparent(attempt).endswith("-00")  # the engine records nothing for an unsampled trace
    tracer.finish(trace)
    assert tracer.buffer.get(trace.id)["spans"][1]["name"] == "completion m"
    assert tracer_for(resolve(TracingConfig(keep=0, enabled=False), environ={})) is None  # nothing to do
