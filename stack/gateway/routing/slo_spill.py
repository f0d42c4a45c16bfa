"""Spill before the SLO breaks: per request, the TTFT estimate on the model's local engines against its
objective, and the verdict the dispatcher follows (adr/0027).

The objective of a model group comes from its model config (`models.*.slo`, or its profile's `slo`: the
composition root hands them in with `set_slo`) or from `gateway.spill.slo`, which wins. Only groups with a
TTFT upper bound are judged; every verdict is counted in `vstack_gateway_slo_decisions_total` with its reason
and the estimate observed in `vstack_gateway_ttft_estimate_seconds`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from stack.config.sections.gateway import SpillSettings
from stack.config.slo import Clause, parse_slo
from stack.gateway.metrics import TTFT_BUCKETS
from stack.gateway.registry import Deployment
from stack.gateway.routing.engine_load import LoadBook
from stack.gateway.routing.ttft_estimate import Estimate, Verdict, decide, estimate, ttft_limit


class SpillGuard:
    def __init__(self, settings: SpillSettings, registry: CollectorRegistry) -> None:
        self.settings = settings
        self.book = LoadBook(settings)
        self.limits: dict[str, Clause] = {}
        for group, spec in settings.slo.items():
            self.set_slo(group, spec, override=True)
        self.decisions = Counter(
            "vstack_gateway_slo_decisions", "Requests to a model with a TTFT objective, by where they went (local, "
            "spill) and why (within_slo, over_slo, no_estimate, no_fallback)", ["model", "decision", "reason"],
            registry=registry,
        )  # fmt: skip
        self.estimates = Histogram("vstack_gateway_ttft_estimate_seconds", "Estimated time to first token on the "
                                   "best local engine, per request judged", ["model"], buckets=TTFT_BUCKETS,
                                   registry=registry)  # fmt: skip

    def set_slo(self, group: str, spec: str | list[str], *, override: bool = False) -> None:
        """The objective of `group` (its TTFT clause is the one kept); gateway.spill.slo's stay unless override."""
        if group in self.settings.slo and not override:
            return
        limit = ttft_limit(parse_slo(spec))
        if limit is not None:
            self.limits[group] = limit
        else:
            self.limits.pop(group, None)

    def on_change(self, dep_id: str, before: Deployment | None, after: Deployment | None) -> None:
        """A registry listener: a deployment gone is forgotten; a new engine behind it (a new address) keeps
        what was learned of the model's speed (stack.gateway.routing.engine_load.LoadBook.restarted)."""
        if after is None:
            self.book.forget(dep_id)
        elif before is not None and before.api_base != after.api_base:
            self.book.restarted(dep_id)

    def watched(self, deployments: Iterable[Deployment]) -> list[Deployment]:
        """The ready local deployments of groups with a TTFT objective: the engines whose metrics are read."""
        groups = self.groups()
        return [d for d in deployments if d.model_group in groups and d.kind == "local" and d.state == "ready"]

    def watches(self, group: str) -> bool:
        return self.settings.enabled and group in self.limits

    def groups(self) -> set[str]:
        return set(self.limits) if self.settings.enabled else set()

    def best(self, engines: Iterable[tuple[Deployment, float | None]], body: dict[str, Any]) -> Estimate | None:
        """The lowest estimate over the group's local engines; (engine, seconds its switch still takes: 0 when
        awake, None when unknown, which gives no estimate for it)."""
        found: Estimate | None = None
        for dep, switch_s in engines:
            if switch_s is None:
                continue
            _, tokens = self.book.tokens_of(dep.id, body)
            est = estimate(self.book.load(dep.id), tokens, self.book.line(dep.id), switch_s)
            if est is not None and (found is None or est.seconds < found.seconds):
                found = est
        return found

    def judge(self, group: str, engines: Iterable[tuple[Deployment, float | None]], body: dict[str, Any],
              has_fallback: bool) -> Verdict | None:  # fmt: skip
        """The verdict for one request to `group`; None when the group has no TTFT objective (or spill is off)."""
        if not self.watches(group):
            return None
        est = self.best(engines, body)
        verdict = decide(est, self.limits[group], headroom=self.settings.headroom, has_fallback=has_fallback)
        self.decisions.labels(group, "spill" if verdict.spill else "local", verdict.reason).inc()
        if est is not None:
            self.estimates.labels(group).observe(est.seconds)
        return verdict
