"""A gateway whose model `m` has two Ray-like replicas routed on KV events, with known figures in its KV index,
for the console's tests (the Models page's replica routing and KV figures) without an engine or a Ray cluster."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterator, Mapping

from bench.harness.gateway_thread import app_in_thread
from stack.config.sections.gateway import GatewayConfig
from stack.gateway.app import create_app
from stack.gateway.registry import Deployment, DeploymentRegistry
from stack.gateway.routing.kv_events import Subscription

BS = 16
BLOCKS = 64  # replica 0 holds 64 blocks of 16 tokens: 1,024 tokens


def replica(i: int) -> Deployment:
    return Deployment(id=f"engine-m-r{i}", model_group="m", kind="local", upstream_model="m", state="ready",
                      api_base=f"http://127.0.0.1:{9 + i}", labels={"replica": str(i), "node": f"node{i}"})  # fmt: skip


def fill(state) -> None:
    """Replica 0: live, 70 blocks stored and 6 removed (64 held), 4 expected, one replay; replica 1: still
    connecting, nothing held; 1,200 choices made by the caches and 3 by the balance rule. Subscriptions set by
    hand: no engine publishes here (the events' own path is tests/gateway/test_kv_routing.py's)."""
    state.routing.replicas.configure("m", "kv_events", None)  # as the engines' hook does from the plan
    kv = state.routing.replicas.kv
    kv.subs["engine-m-r0"] = Subscription("", "", state="live", batches=12, replays=1)
    kv.subs["engine-m-r1"] = Subscription("", "")
    index = kv.index
    index.stored("engine-m-r0", list(range(70)), None, list(range(70 * BS)), BS)
    index.removed("engine-m-r0", list(range(64, 70)))
    index.expect_s = 3600.0  # not expired while a slow machine runs the test
    index.expect("engine-m-r0", [101, 102, 103, 104])
    state.routing.replicas.choices["m"] = Counter({"kv_events": 1200, "balance": 3})  # as 1,203 choices leave it


@contextlib.contextmanager
def kv_console(
    settings: Mapping | None = None, environ: Mapping[str, str] | None = None
) -> Iterator[tuple[str, object]]:
    """Yields (the gateway's URL, its state) with `m`'s two replicas routed on kv_events."""
    config = GatewayConfig.model_validate(dict(settings or {}))
    registry = DeploymentRegistry()
    for i in range(2):
        registry.add(replica(i))
    app = create_app(config, default_model="m", registry=registry, environ=dict(environ or {}))
    with app_in_thread(app) as (url, loop):
        state = app.state.gateway

        async def on_loop() -> None:  # the index belongs to the server's loop
            fill(state)

        asyncio.run_coroutine_threadsafe(on_loop(), loop).result(10)
        yield url, state
