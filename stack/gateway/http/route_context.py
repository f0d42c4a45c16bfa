"""What the routes share, hung on `app.state.gateway` (no module-level singletons)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from stack.config.sections.gateway import GatewayConfig
from stack.gateway.http.auth import KeyRing
from stack.gateway.http.runtime_state import RuntimeState
from stack.gateway.log_health import LogFailures, WatchedLogHandler
from stack.gateway.metrics import GatewayMetrics
from stack.gateway.registry import DeploymentRegistry
from stack.gateway.routing.adapters import AdapterBook
from stack.gateway.routing.deployment_choice import Routing
from stack.gateway.routing.dispatcher import Dispatcher
from stack.gateway.upstreams.provider_keys import KeyPolicy
from stack.manager.manager import ModelManager


@dataclass
class GatewayState:
    settings: GatewayConfig
    registry: DeploymentRegistry
    routing: Routing
    metrics: GatewayMetrics
    dispatcher: Dispatcher
    keys: KeyRing
    admin_keys: KeyRing
    manager: ModelManager | None = None  # when the gateway owns engines
    key_policy: KeyPolicy | None = None  # provider keys deployments added at run time may use
    adapters: AdapterBook | None = None  # LoRA adapters by name
    metrics_keys: KeyRing | None = None  # /metrics*: the metrics key, client keys and admin key (None: open)
    started: int = field(default_factory=lambda: int(time.time()))
    # `vstack reload`: the configuration read again, engines whose command changed restarted (set by the
    # composition root of a gateway that owns its engines; stack.assemble.reloader.Reloader)
    reload: Callable[[], Awaitable[dict[str, Any]]] | None = None
    runtime: RuntimeState = field(default_factory=lambda: RuntimeState(None))  # /admin changes, persisted
    admin_token: str | None = None  # without an admin key: what /admin/* needs (stack.manager.admin_token)
    log_handler: WatchedLogHandler | None = None  # the process's log, watched for lost lines (set by `watch_log`)

    def watch_log(self, handler: WatchedLogHandler) -> None:
        self.log_handler = handler
        self.metrics.registry.register(LogFailures(handler))

    def log_problem(self) -> dict | None:
        return self.log_handler.status() if self.log_handler is not None else None

    def model_cards(self) -> dict[str, str]:
        """Names /v1/models lists (model groups with a ready deployment, and aliases to them) -> owner."""
        cards: dict[str, str] = {}
        for group, deps in sorted(self.registry.groups().items()):
            ready = [d for d in deps if d.state == "ready"]
            # A model the manager can switch in is servable too: listing it is what lets clients ask for it.
            managed = self.manager is not None and self.manager.manages(group)
            if ready or managed:
                cards[group] = "vstack" if managed or any(d.kind == "local" for d in ready) else "cloud"
        if self.adapters is not None:  # an adapter is listed with its base model
            for name in sorted(self.adapters.cards(set(cards))):
                cards.setdefault(name, "vstack")
        for alias in sorted(self.routing.aliases):
            try:
                target = self.routing.resolve(alias)
            except Exception:
                continue
            if target in cards:
                cards.setdefault(alias, cards[target])
        return cards

    def default_ready(self) -> bool:
        group = self.routing.default_group
        return bool(self.registry.ready(group)) and any(
            d.id not in self.routing.cooling_down() for d in self.registry.ready(group)
        )


def get_state(request: Request) -> GatewayState:
    return request.app.state.gateway
