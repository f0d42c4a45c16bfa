"""Choosing among a model's replicas (manager.runtime: ray): small pure strategies behind one table.

- least_outstanding (default): the replica with the fewest requests this gateway has in flight on it
  (ties: the lowest id), the signal a gateway has without asking the engines.
- prefix_affinity: requests with the same session (`user`, or a `session_id` in metadata) or the same
  prompt prefix go to the same replica, whose vLLM prefix cache then holds that prefix. Rendezvous hashing
  (highest random weight) over the live replicas: when one is lost only its keys move.
- round_robin: in turn, the baseline the other two are measured against (bench/replica_routing.py).
- kv_events: the replica whose engine holds the longest prefix of the prompt, by the engines' own KV events
  (stack.gateway.routing.kv_index), weighed against its load: the least of (prompt tokens it would compute) +
  load_weight x (the uncached prompt tokens of this gateway's requests on it still before their first token:
  its prefill queue, which a request leaves at its first token, not at its end). Prefix affinity
  while no candidate's events are live, or the prompt has no token ids (stack.gateway.routing.prompt_tokens).

A model's own strategy (gateway.replica_routing_models) is set per model group with `configure`.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter, deque
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

from stack.gateway.registry import Deployment
from stack.gateway.routing.kv_events import KvEvents
from stack.gateway.routing.kv_index import KvIndex, prompt_keys
from stack.gateway.routing.prompt_tokens import PromptTokens


class ReplicaRouting(StrEnum):
    LEAST_OUTSTANDING = "least_outstanding"
    PREFIX_AFFINITY = "prefix_affinity"
    ROUND_ROBIN = "round_robin"
    KV_EVENTS = "kv_events"


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


Choose = Callable[[list[Deployment], dict[str, Any] | None, Sequence[int] | None], Deployment]


class ReplicaChooser:
    """The gateway's choice among ready replicas, and its count of requests in flight per replica."""

    def __init__(self, routing: str = ReplicaRouting.LEAST_OUTSTANDING, prefix_chars: int = 512,
                 load_weight: float = 0.5, max_blocks: int = 262_144,
                 balance_threshold: int | None = 32) -> None:  # fmt: skip
        self.routing = ReplicaRouting(routing)
        self.per_group: dict[str, ReplicaRouting] = {}
        self.prefix_chars = prefix_chars
        self.load_weight = load_weight
        self.balance_threshold = balance_threshold
        self.choices: dict[str, Counter[str]] = {}  # per model routed on kv_events: how each choice was made
        self.outstanding: dict[str, int] = {}
        self.kv = KvEvents(KvIndex(max_blocks))
        self.tokens = PromptTokens()
        self.queued: dict[str, deque[int]] = {}  # per replica: uncached prompt tokens of requests before prefill
        self._chosen: dict[str, int] = {}  # a replica just chosen -> its request's uncached tokens, until begin
        self.last_choice: dict[str, object] = {}  # the last kv_events choice: its figures (tests, debugging)
        self._turns: dict[str, itertools.count] = {}
        self._table: dict[ReplicaRouting, Choose] = {
            ReplicaRouting.LEAST_OUTSTANDING: lambda c, _b, _t: least_outstanding(c, self.outstanding),
            ReplicaRouting.PREFIX_AFFINITY: lambda c, b, _t: self._affinity(c, b),
            ReplicaRouting.ROUND_ROBIN: lambda c, _b, _t: self._round_robin(c),
            ReplicaRouting.KV_EVENTS: self._kv_events,
        }

    def configure(self, group: str, routing: str | None, model_path: str | None = None) -> None:
        """A model group's own strategy (None: the gateway-wide one); its model's folder, for its tokenizer."""
        if routing:
            self.per_group[group] = ReplicaRouting(routing)
        if model_path:
            self.tokens.configure(group, model_path)

    def routing_of(self, group: str) -> ReplicaRouting:
        return self.per_group.get(group, self.routing)

    async def prompt_tokens(self, group: str, body: dict[str, Any] | None) -> list[int] | None:
        """The prompt's token ids when `group` is routed on KV events (else None, and nothing is computed)."""
        if self.routing_of(group) is not ReplicaRouting.KV_EVENTS or not self.kv.subs:
            return None
        return await self.tokens.of(group, body)

    def choose(self, candidates: list[Deployment], body: dict[str, Any] | None,
               tokens: Sequence[int] | None = None) -> Deployment:  # fmt: skip
        ordered = sorted(candidates, key=lambda d: d.id)
        return self._table[self.routing_of(ordered[0].model_group)](ordered, body, tokens)

    def _affinity(self, candidates: list[Deployment], body: dict[str, Any] | None) -> Deployment:
        key = affinity_key(body, self.prefix_chars)
        if not key:
            return least_outstanding(candidates, self.outstanding)
        chosen = rendezvous(key, [d.id for d in candidates])
        return next(d for d in candidates if d.id == chosen)

    def _round_robin(self, candidates: list[Deployment]) -> Deployment:
        turn = self._turns.setdefault(candidates[0].model_group, itertools.count())
        return candidates[next(turn) % len(candidates)]

    def _kv_events(self, candidates: list[Deployment], body: dict[str, Any] | None,
                   tokens: Sequence[int] | None) -> Deployment:  # fmt: skip
        made = self.choices.setdefault(candidates[0].model_group, Counter())
        if not tokens or not any(self.kv.live(d.id) for d in candidates):
            self.last_choice = {"by": "prefix_affinity"}
            made["prefix_affinity"] += 1
            return self._affinity(candidates, body)
        ids = [d.id for d in candidates]
        hits = self.kv.index.matches(tokens, ids)
        why: dict[str, object]
        if (spread := self._imbalance(candidates)) is not None:
            by, why, chosen = "balance", {"spread": spread}, least_outstanding(candidates, self.outstanding)
        else:
            costs = {i: len(tokens) - hits[i] + self.load_weight * sum(self.queued.get(i, ())) for i in ids}
            chosen = min(candidates, key=lambda d: (costs[d.id], self.outstanding.get(d.id, 0), d.id))
            by, why = "kv_events", {"costs": costs}
        self.last_choice = {"by": by, "chosen": chosen.id, "hits": hits, **why}
        made[by] += 1
        self._chosen[chosen.id] = len(tokens) - hits[chosen.id]
        if size := self.kv.index.block_size([chosen.id]):
            self.kv.index.expect(chosen.id, prompt_keys(tokens, size))
        return chosen

    def _imbalance(self, candidates: list[Deployment]) -> int | None:
        """The spread of requests in flight when it passes `balance_threshold` (else None). SGLang's router rule
        (its cache-aware policy's balance_abs_threshold, 32): past it the least busy replica takes the request
        whatever the caches hold, so one prompt shared by every request (an app's system prompt) does not keep
        every request on the replica that cached it first while the other idles."""
        if self.balance_threshold is None or len(candidates) < 2:
            return None
        loads = [self.outstanding.get(d.id, 0) for d in candidates]
        spread = max(loads) - min(loads)
        return spread if spread > self.balance_threshold else None

    def begin(self, dep_id: str) -> bool:
        """A request starts on `dep_id`. True when its uncached prompt tokens join the replica's prefill queue
        (a kv_events choice): `prefilled` (at its first token) or `end` takes them off."""
        self.outstanding[dep_id] = self.outstanding.get(dep_id, 0) + 1
        if dep_id in self._chosen:
            self.queued.setdefault(dep_id, deque()).append(self._chosen.pop(dep_id))
            return True
        return False

    def prefilled(self, dep_id: str) -> None:
        """A request on `dep_id` has its first token: its prompt is computed, its share leaves the queue (prefills
        end about in the order they began: the oldest share leaves first)."""
        queued = self.queued.get(dep_id)
        if queued:
            queued.popleft()

    def end(self, dep_id: str, queued: bool = False) -> None:
        """A request on `dep_id` ended; `queued`: its share is still in the prefill queue (no first token)."""
        self.outstanding[dep_id] = max(0, self.outstanding.get(dep_id, 0) - 1)
        if queued:
            self.prefilled(dep_id)


def is_replica(dep: Deployment) -> bool:
    return "replica" in dep.labels
