"""`gateway.routing_strategy`: which of a model group's deployments of the same `order` serves a request.

Small pure functions behind one table, fed by what the gateway itself measures of every attempt
(`DeploymentLoad`): LiteLLM's Router, which chose before, learnt load and latency only from calls made
through it, and the gateway's own calls never were, so its strategies chose blind.

- simple-shuffle (default): at random, in proportion to `weight` in a cloud entry's litellm_params
  (then `rpm`, then `tpm`, as LiteLLM reads them); evenly when none has one.
- least-busy: the fewest requests in flight from this gateway.
- latency-based-routing: the lowest mean latency of its last answers (one not measured yet goes first).
- usage-based-routing-v2: the fewest tokens answered in the current minute.
Ties are broken at random, so equal deployments share the load.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from stack.gateway.registry import Deployment

LATENCY_SAMPLES = 10  # answers per deployment the latency strategy averages


class Strategy(StrEnum):
    SIMPLE_SHUFFLE = "simple-shuffle"
    LEAST_BUSY = "least-busy"
    LATENCY = "latency-based-routing"
    USAGE = "usage-based-routing-v2"


@dataclass
class DeploymentLoad:
    """What the gateway measured of each deployment: requests in flight, recent latencies, tokens per minute.
    `in_flight` is the replica chooser's own count (one book for both)."""

    in_flight: dict[str, int] = field(default_factory=dict)
    latencies: dict[str, deque[float]] = field(default_factory=dict)
    tokens: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (minute, tokens in it)
    clock: Callable[[], float] = time.time

    def answered(self, dep_id: str, seconds: float, tokens: int) -> None:
        self.latencies.setdefault(dep_id, deque(maxlen=LATENCY_SAMPLES)).append(seconds)
        minute = int(self.clock() // 60)
        before, used = self.tokens.get(dep_id, (minute, 0))
        self.tokens[dep_id] = (minute, (used if before == minute else 0) + tokens)

    def latency(self, dep_id: str) -> float:
        seen = self.latencies.get(dep_id)
        return sum(seen) / len(seen) if seen else 0.0

    def tokens_this_minute(self, dep_id: str) -> int:
        minute, used = self.tokens.get(dep_id, (0, 0))
        return used if minute == int(self.clock() // 60) else 0

    def forget(self, dep_id: str) -> None:
        self.latencies.pop(dep_id, None)
        self.tokens.pop(dep_id, None)


Choose = Callable[[list[Deployment], DeploymentLoad, random.Random], Deployment]


def simple_shuffle(candidates: list[Deployment], _load: DeploymentLoad, rng: random.Random) -> Deployment:
    for key in ("weight", "rpm", "tpm"):
        if any(isinstance(d.litellm_params.get(key), int | float) for d in candidates):
            weights = [float(d.litellm_params.get(key) or 0) for d in candidates]
            if sum(weights) > 0:
                return rng.choices(candidates, weights=weights)[0]
    return rng.choice(candidates)


def _lowest(candidates: list[Deployment], key: Callable[[Deployment], float], rng: random.Random) -> Deployment:
    best = min(map(key, candidates))
    return rng.choice([d for d in candidates if key(d) == best])


def least_busy(candidates: list[Deployment], load: DeploymentLoad, rng: random.Random) -> Deployment:
    return _lowest(candidates, lambda d: load.in_flight.get(d.id, 0), rng)


def lowest_latency(candidates: list[Deployment], load: DeploymentLoad, rng: random.Random) -> Deployment:
    return _lowest(candidates, lambda d: load.latency(d.id), rng)


def lowest_usage(candidates: list[Deployment], load: DeploymentLoad, rng: random.Random) -> Deployment:
    return _lowest(candidates, lambda d: load.tokens_this_minute(d.id), rng)


STRATEGIES: dict[Strategy, Choose] = {
    Strategy.SIMPLE_SHUFFLE: simple_shuffle,
    Strategy.LEAST_BUSY: least_busy,
    Strategy.LATENCY: lowest_latency,
    Strategy.USAGE: lowest_usage,
}
