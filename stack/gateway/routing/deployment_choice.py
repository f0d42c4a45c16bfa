"""Which deployment serves a request: names to model groups, the fallback plan, and the choice among ready
deployments. The gateway's one routing brain (adr/0028): LiteLLM is its cloud client, not its router.

A request names a model group (or an alias of one). Its plan is that group, then `gateway.fallbacks[group]`
in order (`gateway.context_window_fallbacks[group]` when the prompt is too long for it). Within a group the
choice is among its ready deployments that are neither excluded by this request (failed it already) nor
cooling down (stack.gateway.routing.cooldowns): the lowest `order` first (local engines 1, cloud 2), then
`gateway.routing_strategy` among those (stack.gateway.routing.strategies). A model's replicas (manager.runtime:
ray) are chosen by `gateway.replica_routing` instead (stack.gateway.routing.replicas).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stack.config.sections.gateway import GatewayConfig
from stack.gateway.openai_errors import ModelNotFound
from stack.gateway.registry import Deployment, DeploymentRegistry
from stack.gateway.routing.cooldowns import Cooldowns
from stack.gateway.routing.replicas import ReplicaChooser, is_replica, least_outstanding
from stack.gateway.routing.strategies import STRATEGIES, DeploymentLoad, Strategy


@dataclass(frozen=True)
class Step:
    group: str
    reason: str  # "primary", or why we fell back to it: error, context_window


class Routing:
    def __init__(self, settings: GatewayConfig, registry: DeploymentRegistry, default_group: str,
                 rng: random.Random | None = None) -> None:  # fmt: skip
        self.settings = settings
        self.registry = registry
        self.default_group = default_group
        self.aliases = {"default": default_group, **settings.aliases}
        self.replicas = ReplicaChooser(settings.replica_routing, settings.affinity_prefix_chars,
                                       settings.kv_events_load_weight, settings.kv_events_max_blocks,
                                       settings.kv_events_balance_threshold)  # fmt: skip
        self.load = DeploymentLoad(in_flight=self.replicas.outstanding)
        self.cooldowns = Cooldowns(settings.allowed_fails, settings.cooldown_s)
        self.strategy = STRATEGIES[Strategy(settings.routing_strategy)]
        self.rng = rng or random.Random()
        registry.subscribe(self._on_change)

    def _on_change(self, dep_id: str, before: Deployment | None, after: Deployment | None) -> None:
        if after is None:  # removed: what we knew of it goes with it
            self.cooldowns.forget(dep_id)
            self.load.forget(dep_id)
        if (after is not None and "kv_events" in after.labels) or dep_id in self.replicas.kv.subs:
            self.replicas.kv.follow(dep_id, after)  # its engine's KV events: subscribed while it is ready

    # -- names ---------------------------------------------------------------------------------------
    def known_groups(self) -> set[str]:
        groups = set(self.registry.groups())
        for targets in (*self.settings.fallbacks.values(), *self.settings.context_window_fallbacks.values()):
            groups.update(targets)
        return groups

    def resolve(self, requested: str) -> str:
        """Alias -> model group; 404 for a name that nothing serves or will serve."""
        name = requested
        for _ in range(len(self.aliases) + 1):
            if name not in self.aliases:
                break
            name = self.aliases[name]
        if name in self.registry.groups():
            return name
        known = sorted(self.known_groups() | set(self.aliases))
        raise ModelNotFound(
            f"The model `{requested}` does not exist or you do not have access to it. "
            f"Available: {', '.join(known) or 'none'}.",
            param="model",
        )

    def plan(self, group: str) -> list[Step]:
        steps = [Step(group, "primary")]
        for target in self.settings.fallbacks.get(group, []):
            if target != group and target not in {s.group for s in steps}:
                steps.append(Step(self.aliases.get(target, target), "error"))
        return steps

    def context_plan(self, group: str) -> list[Step]:
        return [
            Step(self.aliases.get(t, t), "context_window")
            for t in self.settings.context_window_fallbacks.get(group, [])
        ]

    # -- the choice ------------------------------------------------------------------------------------
    def pick(self, group: str, exclude: set[str], body: dict[str, Any] | None = None,
             tokens: Sequence[int] | None = None) -> Deployment | None:  # fmt: skip
        """A ready deployment of `group` not in `exclude` and not cooling down; None if none. `tokens`: the
        prompt's token ids, for replicas routed on their KV events (ReplicaChooser.prompt_tokens)."""
        candidates = [d for d in self.registry.ready(group) if d.id not in exclude]
        if not candidates:
            return None
        cooling = self.cooling_down()
        replicas = [d for d in candidates if is_replica(d)]
        if replicas:
            usable = replicas if len(candidates) == 1 else [d for d in replicas if d.id not in cooling]
            # A disaggregated model's requests go to its decode engines (which ask a prefill engine first:
            # stack.gateway.routing.disaggregated); its prefill engines serve whole requests only when no decode
            # engine is ready.
            usable = [d for d in usable if d.labels.get("phase") != "prefill"] or usable
            if usable:
                return self.replicas.choose(usable, body, tokens)
            candidates = [d for d in candidates if not is_replica(d)] or candidates
        candidates = [d for d in candidates if d.id not in cooling]
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        lowest = min(d.order for d in candidates)
        return self.strategy([d for d in candidates if d.order == lowest], self.load, self.rng)

    def prefill_for(self, decode: Deployment, exclude: set[str]) -> Deployment | None:
        """The prefill engine for a request `decode` serves (adr/0052): among its model's ready prefill engines
        not in `exclude`, the one with the fewest requests in flight, those cooling down last."""
        ready = [d for d in self.registry.ready(decode.model_group)
                 if d.labels.get("phase") == "prefill" and d.id not in exclude]  # fmt: skip
        cooling = self.cooling_down()
        usable = sorted([d for d in ready if d.id not in cooling] or ready, key=lambda d: d.id)
        return least_outstanding(usable, self.replicas.outstanding) if usable else None

    def cooling_down(self) -> set[str]:
        """The ready deployments left out now (stack.gateway.routing.cooldowns)."""
        cooling = self.cooldowns.cooling()
        if not cooling:
            return cooling
        return {i for i in cooling if (d := self.registry.get(i)) is not None and d.state == "ready" and d.routable}

    def report_failure(self, dep: Deployment, status: int) -> None:
        """A failed attempt: past `allowed_fails` a minute (or on a 429) the deployment cools down, unless it
        is the only one its group has ready."""
        alone = len(self.registry.ready(dep.model_group)) <= 1
        self.cooldowns.failed(dep.id, status, alone)

    def answered(self, dep: Deployment, seconds: float, usage: dict | None) -> None:
        """An attempt that answered: its latency and tokens, for the latency and usage strategies."""
        tokens = usage.get("total_tokens") if isinstance(usage, dict) else None
        self.load.answered(dep.id, seconds, tokens if isinstance(tokens, int) else 0)
