"""The gateway's own work per request before the upstream call (issue 54, item 2), at a burst.

    .venv/bin/python bench/gateway_request_path.py [--burst 256] [--rounds 20] [--groups 1,20,100]

In one process, no network: the app as `create_app` builds it, with `--groups` model groups registered (one local
deployment each, as many models or replicas as a site has), and a stand-in for the engine call (the dispatcher's
delegate hook, stack.gateway.routing.delegation) that answers at once. `--burst` requests enter the dispatcher
together, as 256 streams starting at once do; timed per request: from `Dispatcher.handle` to the upstream call
(the admission decision, routing, quotas, the attempt's bookkeeping), and the burst's whole pass (what the last
request's first token waits for on one event loop). Run with the deployment registry's groups built per call (as
before issue 54) and built once per change (now), side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stack.config.sections.gateway import GatewayConfig  # noqa: E402
from stack.gateway.app import create_app  # noqa: E402
from stack.gateway.registry import Deployment, DeploymentRegistry  # noqa: E402
from stack.gateway.routing.answer import Answer  # noqa: E402
from stack.gateway.routing.delegation import DELEGATE  # noqa: E402


class Engine:
    """The delegate: records when the upstream call would start, answers a whole body at once."""

    def __init__(self) -> None:
        self.reached: list[float] = []

    async def attempt(self, at, path, payload, traceparent, stream, strip_usage) -> Answer:
        self.reached.append(time.perf_counter())
        at.answered({"prompt_tokens": 5, "completion_tokens": 1})
        return Answer(at.headers, b"{}")


def uncached_groups(self: DeploymentRegistry) -> dict[str, list[Deployment]]:
    out: dict[str, list[Deployment]] = {}
    for dep in self._items.values():
        out.setdefault(dep.model_group, []).append(dep)
    return out


async def burst(dispatcher, n: int) -> tuple[list[float], float]:
    """(each request's wait from entering to its upstream call, the burst's whole pass)"""
    engine = Engine()
    DELEGATE.set(engine)
    body = {"model": "m0", "messages": [{"role": "user", "content": "Say something. " * 50}], "max_tokens": 64}
    starts: list[float] = []

    async def one() -> None:
        starts.append(time.perf_counter())
        await dispatcher.handle("chat", dict(body))

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    each = [r - s for s, r in zip(starts, engine.reached, strict=True)]
    return each, engine.reached[-1] - t0


def measure(groups: int, n: int, rounds: int, cached: bool) -> tuple[float, float]:
    """(µs of the gateway's work per request before its upstream call: the burst's pass over its size; ms until
    the burst's last request reached its upstream call), medians over the rounds"""
    registry = DeploymentRegistry()
    for g in range(groups):
        registry.add(Deployment(id=f"local-{g}", model_group=f"m{g}", kind="local", upstream_model=f"m{g}",
                                api_base="http://127.0.0.1:9"))  # fmt: skip
    app = create_app(GatewayConfig(), default_model="m0", registry=registry, environ={})
    dispatcher = app.state.gateway.dispatcher
    original = DeploymentRegistry.groups
    if not cached:
        DeploymentRegistry.groups = uncached_groups  # type: ignore[method-assign]
    try:
        last = [asyncio.run(burst(dispatcher, n))[1] for _ in range(rounds)]
    finally:
        DeploymentRegistry.groups = original  # type: ignore[method-assign]
    return statistics.median(last) / n * 1e6, statistics.median(last) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--burst", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--groups", default="1,20,100", help="model groups registered (comma-separated runs)")
    args = ap.parse_args()
    print(f"{args.burst} requests entering together, median of {args.rounds} bursts")
    print(
        f"{'groups':>6} {'before: µs/req':>15} {'now: µs/req':>12} {'x':>5} {'before: last ms':>16} "
        f"{'now: last ms':>13}"
    )
    for g in (int(x) for x in args.groups.split(",")):
        measure(g, 16, 2, True)  # warm-up
        now, before = [], []
        for _ in range(args.rounds):  # interleaved, so that drift and the heap's growth hit both alike
            now.append(measure(g, args.burst, 1, cached=True))
            before.append(measure(g, args.burst, 1, cached=False))
        n_us, n_ms = (statistics.median(x) for x in zip(*now, strict=True))
        b_us, b_ms = (statistics.median(x) for x in zip(*before, strict=True))
        print(f"{g:>6} {b_us:>15.1f} {n_us:>12.1f} {n_us / b_us:>5.2f} {b_ms:>16.1f} {n_ms:>13.1f}")


if __name__ == "__main__":
    main()
