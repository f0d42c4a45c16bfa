"""The gateway's Prometheus metrics, in a registry owned by the app (no process-wide globals).

Names start with `vstack_gateway_`; the engines' own `vllm:*` metrics are served unchanged at
/metrics/engines/{deployment} and listed for Prometheus HTTP service discovery at /metrics/targets.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Streams on a CPU engine take seconds; cloud calls up to minutes.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# sub-millisecond at one stream, tens of ms at a burst, seconds behind a switch
TO_ENGINE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2.5, 5, 10, 30)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.others: list[CollectorRegistry] = []
        r = self.registry
        self.requests = Counter(
            "vstack_gateway_requests",
            "Requests answered, by model group, deployment and HTTP status",
            ["model", "deployment", "status"],
            registry=r,
        )
        self.rejected = Counter(
            "vstack_gateway_rejected_requests",
            "Requests the gateway refused itself (4xx), by status and reason (invalid_api_key, invalid_body, "
            "model_not_found, request_too_large, rate_limit_exceeded, ...)",
            ["status", "reason"],
            registry=r,
        )
        self.latency = Histogram(
            "vstack_gateway_request_duration_seconds",
            "Request start to last byte",
            ["model", "deployment"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "vstack_gateway_time_to_first_token_seconds",
            "Request start to the first streamed chunk",
            ["model", "deployment"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.to_engine = Histogram(
            "vstack_gateway_time_to_engine_call_seconds",
            "A request's arrival at the gateway to its call to a local engine, per attempt: the gateway's own share "
            "of the first token (checks, admission and any wait for a switch, routing; with workers, the owner's "
            "decision and its frames)",
            ["model", "deployment"],
            buckets=TO_ENGINE_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "vstack_gateway_tokens",
            "Tokens by direction (prompt = in, completion = out)",
            ["model", "deployment", "direction"],
            registry=r,
        )
        self.fallbacks = Counter(
            "vstack_gateway_fallbacks",
            "Requests sent on to another model group or deployment",
            ["from_model", "to_model", "reason"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "vstack_gateway_upstream_errors",
            "Failed attempts at a deployment, by reason",
            ["deployment", "reason"],
            registry=r,
        )
        self.in_flight = Gauge(
            "vstack_gateway_requests_in_flight",
            "Requests being answered now",
            ["model"],
            registry=r,
        )
        self.deployment_up = Gauge(
            "vstack_gateway_deployment_up",
            "1 when the deployment is ready",
            ["model", "deployment", "kind"],
            registry=r,
        )

    def include(self, registry: CollectorRegistry) -> None:
        """Serve another component's metrics at /metrics too (the model manager's)."""
        self.others.append(registry)

    def render(self) -> bytes:
        return b"".join(generate_latest(r) for r in (self.registry, *self.others))

    def usage(self, model: str, deployment: str, usage: dict | None) -> None:
        if not usage:
            return
        # Chat/completions name them prompt/completion; Responses and Anthropic Messages input/output.
        prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
        completion = usage.get("completion_tokens", usage.get("output_tokens"))
        if isinstance(prompt, int):
            self.tokens.labels(model, deployment, "prompt").inc(prompt)
        if isinstance(completion, int):
            self.tokens.labels(model, deployment, "completion").inc(completion)
