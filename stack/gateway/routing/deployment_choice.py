"""Routing decisions: aliases, the fallback plan, and LiteLLM's Router choosing a deployment.

LiteLLM's Router holds the ready deployments (its `model_list`) and decides, per model group, which one
serves: `order` puts local engines (1) before cloud models (2), cooldowns take failing deployments out
for `cooldown_s`, and the configured strategy (simple-shuffle, least-busy, latency-based) picks among
the rest. The gateway does the HTTP itself (see adr/0006): it asks the Router for a deployment, reports
failures back so cooldowns work, and walks the fallback plan.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from stack.config.sections.gateway import GatewayConfig
from stack.gateway.openai_errors import ModelNotFound
from stack.gateway.registry import Deployment, DeploymentRegistry
from stack.gateway.routing.replicas import ReplicaChooser, is_replica

log = logging.getLogger("stack.gateway.routing")


def _quiet_litellm() -> None:
    # Offline: LiteLLM must not fetch its cost map at import; and its INFO logs are per request.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_LOG", "ERROR")


@dataclass(frozen=True)
class Step:
    group: str
    reason: str  # "primary", or why we fell back to it: error, context_window


class Routing:
    def __init__(self, settings: GatewayConfig, registry: DeploymentRegistry, default_group: str) -> None:
        _quiet_litellm()
        self.settings = settings
        self.registry = registry
        self.default_group = default_group
        self.aliases = {"default": default_group, **settings.aliases}
        self._router: Any = None  # LiteLLM's Router: built on first use (`router`)
        self.replicas = ReplicaChooser(settings.replica_routing, settings.affinity_prefix_chars)
        registry.subscribe(self._sync)

    @property
    def router(self) -> Any:
        """LiteLLM's Router, built on first use with every routable deployment. Importing LiteLLM takes ~3 s:
        the gateway does it on a thread once it serves (`preload`), so neither its start nor a request waits
        for it; a gateway with one deployment per model never needs the Router until a failure is reported."""
        if self._router is None:
            from litellm import Router

            # Fallbacks are walked by the gateway, so the Router itself must not retry or fall back.
            self._router = Router(
                model_list=[],
                routing_strategy=self.settings.routing_strategy,
                num_retries=0,
                allowed_fails=self.settings.allowed_fails,
                cooldown_time=self.settings.cooldown_s,
                enable_pre_call_checks=False,
            )
            for dep in self.registry.all():
                self._sync(dep.id, None, dep)
        return self._router

    @staticmethod
    def preload() -> None:
        """Import what the Router and the cloud calls need (run on a thread: ~3 s of LiteLLM's imports)."""
        _quiet_litellm()
        import litellm  # noqa: F401
        from litellm import Router  # noqa: F401
        from litellm.router_utils.cooldown_handlers import get_cooldown_deployments  # noqa: F401
        from litellm.types.router import Deployment  # noqa: F401

    # -- registry -> Router -------------------------------------------------------------------------
    def _sync(self, dep_id: str, before: Deployment | None, after: Deployment | None) -> None:
        if self._router is None:
            return  # the Router reads the whole registry when it is built
        from litellm.types.router import Deployment as RouterDeployment

        if before is not None and before.state == "ready" and before.routable:
            self._router.delete_deployment(id=dep_id)
        if after is not None and after.state == "ready" and after.routable:
            self._router.add_deployment(RouterDeployment(**after.router_entry()))

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

    # -- Router ----------------------------------------------------------------------------------
    async def pick(self, group: str, exclude: set[str], body: dict | None = None) -> Deployment | None:
        """A ready deployment of `group` that is not cooling down, chosen by the Router; None if none.
        A model's replicas (manager.runtime: ray) are chosen by `gateway.replica_routing` instead."""
        candidates = [d for d in self.registry.ready(group) if d.id not in exclude]
        if not candidates:
            return None
        if any(is_replica(d) for d in candidates):
            cooling = self.cooling_down() if len(candidates) > 1 else set()
            rest = [d for d in candidates if is_replica(d) and d.id not in cooling]
            if rest:
                return self.replicas.choose(rest, body)
            candidates = [d for d in candidates if not is_replica(d)] or candidates
        if len(candidates) == 1 and len(self.registry.ready(group)) == 1:
            # One deployment: the Router's only decision is whether it is cooling down; ask just that
            # (the full selection costs ~0.3 ms per request and would pick the same one).
            if candidates[0].id in self.cooling_down():
                return None
            return candidates[0]
        try:
            chosen = await self.router.async_get_available_deployment(model=group, request_kwargs={})
        except Exception as exc:  # the Router raises when every deployment cools down
            log.debug("router: no deployment for %s: %s", group, type(exc).__name__)
            return None
        dep = self.registry.get(((chosen or {}).get("model_info") or {}).get("id", ""))
        if dep is None or dep.id in exclude:
            rest = [d for d in candidates if d.id not in self.cooling_down()]
            return min(rest, key=lambda d: d.order) if rest else None
        return dep

    def cooling_down(self) -> set[str]:
        if self._router is None:
            return set()  # no failure reported yet, so nothing cools down (and LiteLLM need not be loaded)
        now = time.time()
        if now - self._cooldown_checked_at < 0.05:
            return self._cooldown_ids
        from litellm.router_utils.cooldown_handlers import get_cooldown_deployments

        self._cooldown_ids = set(get_cooldown_deployments(self.router, parent_otel_span=None))
        self._cooldown_checked_at = now
        return self._cooldown_ids

    _cooldown_checked_at = 0.0
    _cooldown_ids: set[str] = set()  # noqa: RUF012 - replaced, never mutated

    def report_failure(self, dep: Deployment, exc: Exception, status: int) -> None:
        """Count a failure in the Router's books; past `allowed_fails` a minute the deployment cools down."""
        import litellm

        err = litellm.ServiceUnavailableError(
            message=f"{dep.id}: {type(exc).__name__}", llm_provider="vstack", model=dep.upstream_model
        )
        err.status_code = status
        kwargs = {
            "exception": err,
            "litellm_params": {"model_info": {"id": dep.id}, "metadata": {"model_group": dep.model_group}},
        }
        self.router.deployment_callback_on_failure(kwargs, None, time.time(), time.time())
        self._cooldown_checked_at = 0.0
