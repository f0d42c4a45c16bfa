"""The gateway's own deployment choice (stack.gateway.routing, adr/0028): order, cooldowns and the strategies,
fed by what the gateway measures. Pure: a registry, a fake clock, a seeded random source; no server."""

from __future__ import annotations

import random

import pytest

from stack.config.sections.gateway import GatewayConfig
from stack.gateway.registry import Deployment, DeploymentRegistry
from stack.gateway.routing.cooldowns import Cooldowns
from stack.gateway.routing.deployment_choice import Routing


def dep(dep_id: str, order: int = 1, group: str = "m", **params: object) -> Deployment:
    kind = "cloud" if params else "local"
    return Deployment(id=dep_id, model_group=group, kind=kind, upstream_model=group, order=order,
                      api_base=None if params else "http://127.0.0.1:1", litellm_params=dict(params))  # fmt: skip


def routing(*deps: Deployment, **settings: object) -> Routing:
    registry = DeploymentRegistry()
    for d in deps:
        registry.add(d)
    return Routing(GatewayConfig(**settings), registry, "m", rng=random.Random(0))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_lowest_order_serves_and_the_next_when_it_cools_down() -> None:
    r = routing(dep("local", 1), dep("cloud", 2, model="openai/x"), allowed_fails=1, cooldown_s=30)
    assert {r.pick("m", set()).id for _ in range(20)} == {"local"}
    r.report_failure(r.registry.get("local"), 502)
    assert r.pick("m", set()).id == "local"  # one failure is within allowed_fails
    r.report_failure(r.registry.get("local"), 502)
    assert r.cooling_down() == {"local"}
    assert r.pick("m", set()).id == "cloud"
    assert r.pick("m", {"cloud"}) is None  # the rest cools down or failed this request


def test_cooldowns_count_a_minute_cool_at_once_on_429_and_spare_a_lone_deployment() -> None:
    clock = Clock()
    c = Cooldowns(allowed_fails=2, cooldown_s=5, clock=clock)
    assert not c.failed("a", 502, alone=False)
    clock.now += 61  # out of the minute: forgotten
    assert not c.failed("a", 502, alone=False) and not c.failed("a", 502, alone=False)
    assert c.failed("a", 502, alone=False) and c.cooling() == {"a"}
    clock.now += 5
    assert c.cooling() == set()
    assert c.failed("b", 429, alone=False) and c.cooling() == {"b"}  # the provider said slow down
    assert not c.failed("c", 429, alone=True)  # leaving out the only one would be a certain 503
    assert not Cooldowns(allowed_fails=0, cooldown_s=0, clock=clock).failed("d", 429, alone=False)


def test_a_lone_deployment_never_cools_down_in_its_group() -> None:
    r = routing(dep("only"), allowed_fails=0, cooldown_s=30)
    for _ in range(5):
        r.report_failure(r.registry.get("only"), 502)
    assert r.cooling_down() == set() and r.pick("m", set()).id == "only"


def test_least_busy_takes_the_fewest_in_flight() -> None:
    r = routing(dep("a"), dep("b"), dep("c"), routing_strategy="least-busy")
    for busy, n in (("a", 2), ("b", 1)):
        for _ in range(n):
            r.replicas.begin(busy)
    assert {r.pick("m", set()).id for _ in range(20)} == {"c"}
    r.replicas.begin("c")
    r.replicas.begin("c")
    assert {r.pick("m", set()).id for _ in range(20)} == {"b"}


def test_latency_based_prefers_the_unmeasured_then_the_fastest() -> None:
    r = routing(dep("slow"), dep("fast"), routing_strategy="latency-based-routing")
    r.answered(r.registry.get("slow"), 2.0, None)
    assert r.pick("m", set()).id == "fast"  # not measured yet: tried first
    r.answered(r.registry.get("fast"), 0.5, None)
    assert {r.pick("m", set()).id for _ in range(20)} == {"fast"}


def test_usage_based_takes_the_fewest_tokens_this_minute() -> None:
    r = routing(dep("a"), dep("b"), routing_strategy="usage-based-routing-v2")
    r.answered(r.registry.get("a"), 0.1, {"total_tokens": 500})
    r.answered(r.registry.get("b"), 0.1, {"total_tokens": 20})
    assert {r.pick("m", set()).id for _ in range(20)} == {"b"}


def test_simple_shuffle_spreads_evenly_or_by_weight() -> None:
    even = routing(dep("a"), dep("b"))
    seen = [even.pick("m", set()).id for _ in range(400)]
    assert 150 < seen.count("a") < 250
    weighted = routing(dep("x", model="openai/x", weight=9), dep("y", model="openai/y", weight=1))
    seen = [weighted.pick("m", set()).id for _ in range(400)]
    assert seen.count("x") > 300


STRATEGIES = ["simple-shuffle", "least-busy", "latency-based-routing", "usage-based-routing-v2"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_keeps_to_the_lowest_order(strategy: str) -> None:
    r = routing(dep("one", 1), dep("two", 1), dep("cloud", 2, model="openai/x"), routing_strategy=strategy)
    assert {r.pick("m", set()).id for _ in range(50)} <= {"one", "two"}
