"""Choosing among a model's replicas (manager.runtime: ray): small pure strategies behind one table.

- least_outstanding (default): the replica with the fewest requests this gateway has in flight on it
  (ties: the lowest id), the signal a gateway has without asking the engines.
- prefix_affinity: requests with the same session (`user`, or a `session_id` in metadata) or the same
  prompt prefix go to the same replica, whose vLLM prefix cache then holds that prefix. Rendezvous hashing
  (highest random weight) over the live replicas: when one is lost only its keys move.
- round_robin: in turn, the baseline the other two are measured against (bench/replica_routing.py).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from stack.gateway.registry import Deployment


class ReplicaRouting(StrEnum):
    LEAST_OUTSTANDING = "least_outstanding"
    PREFIX_AFFINITY = "prefix_affinity"
    ROUND_ROBIN = "round_robin"


def affinity_key(body: dict[str, Any] | None, prefix_chars: int) -> str:
    """A session if the client names one, else the first `prefix_chars` characters of the prompt."""
    if not body:
        return ""
    meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    session = meta.get("session_id") or body.get("user")
    if session:
        return f"session:{session}"
    if "messages" in body:
        parts = []
        for m in body.get("messages") or []:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):
                content = "".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
            parts.append(f"{m.get('role', '') if isinstance(m, dict) else ''}:{content or ''}\n")
            if sum(map(len, parts)) >= prefix_chars:
                break
        text = "".join(parts)
    else:
        prompt = body.get("prompt", body.get("input", ""))
        text = prompt if isinstance(prompt, str) else str(prompt)
    return "prefix:" + text[:prefix_chars]


def rendezvous(key: str, ids: list[str]) -> str:
    """The id with the highest hash of (key, id): stable per key, only a lost id's keys move."""
    return max(ids, key=lambda i: hashlib.blake2b(f"{key}|{i}".encode(), digest_size=8).digest())


def least_outstanding(candidates: list[Deployment], outstanding: dict[str, int]) -> Deployment:
    return min(candidates, key=lambda d: (outstanding.get(d.id, 0), d.id))


class ReplicaChooser:
    """The gateway's choice among ready replicas, and its count of requests in flight per replica."""

    def __init__(self, routing: str = ReplicaRouting.LEAST_OUTSTANDING, prefix_chars: int = 512) -> None:
        self.routing = ReplicaRouting(routing)
        self.prefix_chars = prefix_chars
        self.outstanding: dict[str, int] = {}
        self._turns: dict[str, itertools.count] = {}
        self._table: dict[ReplicaRouting, Callable[[list[Deployment], dict[str, Any] | None], Deployment]] = {
            ReplicaRouting.LEAST_OUTSTANDING: lambda c, _b: least_outstanding(c, self.outstanding),
            ReplicaRouting.PREFIX_AFFINITY: self._affinity,
            ReplicaRouting.ROUND_ROBIN: self._round_robin,
        }

    def choose(self, candidates: list[Deployment], body: dict[str, Any] | None) -> Deployment:
        return self._table[self.routing](sorted(candidates, key=lambda d: d.id), body)

    def _affinity(self, candidates: list[Deployment], body: dict[str, Any] | None) -> Deployment:
        key = affinity_key(body, self.prefix_chars)
        if not key:
            return least_outstanding(candidates, self.outstanding)
        chosen = rendezvous(key, [d.id for d in candidates])
        return next(d for d in candidates if d.id == chosen)

    def _round_robin(self, candidates: list[Deployment], _body: dict[str, Any] | None) -> Deployment:
        turn = self._turns.setdefault(candidates[0].model_group, itertools.count())
        return candidates[next(turn) % len(candidates)]

    def begin(self, dep_id: str) -> None:
        self.outstanding[dep_id] = self.outstanding.get(dep_id, 0) + 1

    def end(self, dep_id: str) -> None:
        self.outstanding[dep_id] = max(0, self.outstanding.get(dep_id, 0) - 1)


def is_replica(dep: Deployment) -> bool:
    return "replica" in dep.labels
