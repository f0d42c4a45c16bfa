"""The gateway's Prometheus metrics, in a registry owned by the app (no process-wide globals).

Names start with `vstack_gateway_`; the engines' own `vllm:*` metrics are served unchanged at
/metrics/engines/{deployment} and listed for Prometheus HTTP service discovery at /metrics/targets.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Streams on a CPU engine take seconds; cloud calls up to minutes.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Switches: ms (resident) to minutes (a cold start on a CPU, a large model from disk).
SWITCH_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "vstack_gateway_requests",
            "Requests answered, by model group, deployment and HTTP status",
            ["model", "deployment", "status"],
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

        # The model manager (stack.manager): switches, restarts, and requests waiting for a switch.
        self.switches = Counter(
            "vstack_manager_switches", "Switches to a model, by kind (resident, sleeping, cold)", ["model", "kind"],
            registry=r,
        )
        self.switch_seconds = Histogram(
            "vstack_manager_switch_duration_seconds", "Switch requested to model ready, by kind", ["kind"],
            buckets=SWITCH_BUCKETS, registry=r,
        )
        self.evictions = Counter(
            "vstack_manager_evictions", "Models put to sleep or stopped to make room", ["model", "action"], registry=r
        )
        self.restarts = Counter("vstack_manager_restarts", "Crashed engines restarted", ["model"], registry=r)
        self.queue_length = Gauge(
            "vstack_manager_queue_length", "Requests waiting for their model to be ready", ["model"], registry=r
        )
        self.queue_wait = Histogram(
            "vstack_manager_queue_wait_seconds", "Time a request waited for its model", ["model"],
            buckets=SWITCH_BUCKETS, registry=r,
        )
        self.model_state = Gauge(
            "vstack_manager_model_state", "1 for the state each model is in", ["model", "state"], registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

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
