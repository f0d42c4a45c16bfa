"""The deployments the gateway can route to, added and removed while it runs.

A deployment is one place a model group can be served: a local engine (an OpenAI-compatible server on
loopback, usually vLLM) or a cloud model reached through a LiteLLM provider. Only `ready` deployments
are chosen (stack.gateway.routing.deployment_choice); the others (starting, failed, stopped) stay here so
/admin/* can show them and so that a request for a starting model gets 503 + Retry-After, not 404. The model manager
(stack.manager: switching, sleep, restarts) drives the states through `set_state` and `update`, by the
gateway's subscription to its state changes (stack.gateway.engines.follow).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Kind = Literal["local", "cloud"]


@dataclass
class Deployment:
    id: str
    model_group: str  # the name clients ask for (or a fallback points at)
    kind: Kind
    upstream_model: str  # local: the engine's served name; cloud: LiteLLM's provider/model
    api_base: str | None = None  # local: http://127.0.0.1:PORT (no /v1)
    litellm_params: dict[str, Any] = field(default_factory=dict)  # cloud: without secrets
    api_key_env: str | None = None
    order: int = 1
    context_window: int | None = None
    timeout_s: float | None = None
    state: str = "ready"  # a model state (stack.manager.states.ModelState); cloud deployments stay ready
    detail: str = ""  # why it is failed/stopped, engine pid, ...
    since: float = field(default_factory=time.time)
    labels: dict[str, str] = field(default_factory=dict)
    # local: the credential of an engine we started (stack.engine_env); never shown, logged or rendered
    engine_key: str | None = field(default=None, repr=False)

    @property
    def routable(self) -> bool:
        return self.labels.get("role") != "set"

    def auth(self) -> dict[str, str]:
        """The header a local engine we started wants (its key); none for others."""
        return {"Authorization": f"Bearer {self.engine_key}"} if self.engine_key else {}

    def public(self) -> dict[str, Any]:
        shown = asdict(self)
        shown.pop("litellm_params")
        shown.pop("engine_key")
        shown["provider_model"] = self.litellm_params.get("model") if self.kind == "cloud" else None
        return shown


Listener = Callable[[str, Deployment | None, Deployment | None], None]


class DeploymentRegistry:
    """Deployments by id; listeners (routing, liveness, adapters) hear every change (id, before, after)."""

    def __init__(self) -> None:
        self._items: dict[str, Deployment] = {}
        self._listeners: list[Listener] = []
        self._ids = itertools.count(1)
        # groups() per request (several times: resolve, task, admission): built once per change of the set of
        # deployments or of their groups, not per call (issue 54, item 2). States are read live from the
        # deployments themselves, so a state change needs no rebuild.
        self._groups: dict[str, list[Deployment]] | None = None

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _notify(self, dep_id: str, before: Deployment | None, after: Deployment | None) -> None:
        for listener in self._listeners:
            listener(dep_id, before, after)

    def new_id(self, prefix: str) -> str:
        """A fresh id: never one in use (ids given by hand, like `local-1`, are skipped over)."""
        while (candidate := f"{prefix}-{next(self._ids)}") in self._items:
            pass
        return candidate

    def add(self, dep: Deployment) -> Deployment:
        before = self._items.get(dep.id)
        self._items[dep.id] = dep
        self._groups = None
        self._notify(dep.id, before, dep)
        return dep

    def remove(self, dep_id: str) -> Deployment | None:
        before = self._items.pop(dep_id, None)
        if before is not None:
            self._groups = None
            self._notify(dep_id, before, None)
        return before

    def set_state(self, dep_id: str, state: str, detail: str = "") -> Deployment | None:
        dep = self._items.get(dep_id)
        if dep is None:
            return None
        before = Deployment(**{**dep.__dict__})
        dep.state, dep.detail, dep.since = state, detail, time.time()
        self._notify(dep_id, before, dep)
        return dep

    def update(self, dep_id: str, **fields: Any) -> Deployment | None:
        """Change other fields (a restarted engine's api_base); listeners hear it like a state change."""
        dep = self._items.get(dep_id)
        if dep is None:
            return None
        if all(getattr(dep, key) == value for key, value in fields.items()):
            return dep  # nothing changed: listeners need not hear it
        before = Deployment(**{**dep.__dict__})
        for key, value in fields.items():
            setattr(dep, key, value)
        self._groups = None  # its group may have changed
        self._notify(dep_id, before, dep)
        return dep

    def get(self, dep_id: str) -> Deployment | None:
        return self._items.get(dep_id)

    def all(self) -> list[Deployment]:
        return list(self._items.values())

    def groups(self) -> dict[str, list[Deployment]]:
        """Deployments by model group, in the order they were added. Shared: read it, do not change it."""
        if self._groups is None:
            out: dict[str, list[Deployment]] = {}
            for dep in self._items.values():
                out.setdefault(dep.model_group, []).append(dep)
            self._groups = out
        return self._groups

    def ready(self, group: str) -> list[Deployment]:
        """Deployments that can serve `group` now. A replica set (labels role=set) is its replicas' summary
        for /admin/models: its replicas are the deployments that serve."""
        return [d for d in self.groups().get(group, ()) if d.state == "ready" and d.routable]
