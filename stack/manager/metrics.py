"""The model manager's Prometheus metrics (`vstack_manager_*`), in a registry of its own.

The gateway serves them at /metrics beside its own (stack.gateway.metrics renders both registries).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Switches: ms (resident) to minutes (a cold start on a CPU, a large model from disk).
SWITCH_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


class ManagerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
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
