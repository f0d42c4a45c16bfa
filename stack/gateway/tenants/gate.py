"""What the dispatcher asks of the tenants: may this caller send this request now (its models, its limits),
where it waits for its engines (the admission queue), and what it used once answered."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from stack.config.sections.tenants import AdmissionSettings, TenantConfig
from stack.gateway.openai_errors import Forbidden, RateLimited
from stack.gateway.tenants.admission import FairAdmission
from stack.gateway.tenants.book import OTHER, Tenant, TenantBook
from stack.gateway.tenants.limits import Hold, Limiter, Meter, OverLimit, estimate_tokens
from stack.gateway.tenants.usage import Totals, UsageBook, tokens_of

log = logging.getLogger("stack.gateway.tenants")
SPILLABLE = ("rpm", "tpm", "concurrent", "tokens_per_day")  # the box's capacity; budgets hold on the cloud too
NORMAL = 1


@dataclass
class Caller:
    """Who sent a request: the key's name (a named key's or a gateway.api_keys entry's), and the named key."""

    key_name: str | None = None
    tenant: Tenant | None = None


@dataclass
class Quota:
    """One request's pass: who it counts for, its class, what it holds of its tenant's limits."""

    label: str  # the metrics' tenant label
    flow: str  # whom it is fair against in the admission queue
    klass: int = NORMAL
    weight: float = 1.0
    estimate: int = 0
    priority: int = 0  # handed to an engine run with scheduling_policy: priority
    hold: Hold | None = None
    meter: Meter | None = None  # its tenant's (spilled requests count in its totals, not its windows)
    over_limit: str = ""  # the limit it broke: spilled to the model's fallbacks
    waited_s: float = 0.0  # in the admission queue
    refused: bool = field(default=False, repr=False)  # by the admission queue: counted there, not as an error

    def release(self) -> None:
        if self.hold is not None:
            self.hold.release()


class Gate:
    def __init__(self, admission: AdmissionSettings, registry: CollectorRegistry) -> None:
        self.book = TenantBook()
        self.limiter = Limiter()
        self.usage = UsageBook(registry)
        self.totals = Totals(None)
        self.admission = FairAdmission(admission) if admission.enabled else None
        self.settings = admission
        self._unpriced: set[str] = set()

    def configure(self, configs: list[TenantConfig], environ: Mapping[str, str] | None = None,
                  totals_path: Path | None = None) -> None:  # fmt: skip
        """The configuration's named keys (their env keys read now), and where the budgets' totals are kept."""
        self.book = TenantBook.from_config(configs, environ)
        self.totals = Totals(totals_path)
        self.totals.load(self.limiter.meters)

    # -- before routing ---------------------------------------------------------------------------------
    def check(self, caller: Caller | None, endpoint: str, body: dict[str, Any], model: str, group: str,
              can_spill: bool) -> Quota:  # fmt: skip
        """The request's pass; RateLimited (429, the limit named) or Forbidden (a model it may not use)."""
        tenant = caller.tenant if caller is not None else None
        if tenant is None:
            flow = caller.key_name if caller is not None and caller.key_name else "anonymous"
            return Quota(OTHER, flow)
        c = tenant.config
        quota = Quota(self.book.label(tenant), tenant.name, tenant.klass, c.weight, priority=tenant.priority_value,
                      meter=self.limiter.meter(tenant.name))  # fmt: skip
        if not tenant.may_use(model, group):
            self.usage.count(quota.label, group, "refused")
            raise Forbidden(f"key {tenant.name!r} may not use `{model}` (it may use: {', '.join(c.models)}); an admin "
                            f"adds it: vstack keys add {tenant.name} --replace --model ...", param="model",
                            code="model_not_allowed")  # fmt: skip
        quota.estimate = estimate_tokens(endpoint, body, self.settings.default_output_tokens)
        breach = self.limiter.breach(tenant.name, c.limits, quota.estimate)
        if breach is None:
            quota.hold = self.limiter.hold(tenant.name, quota.estimate)
            return quota
        if c.spill and can_spill and breach.limit in SPILLABLE:
            quota.over_limit = breach.limit
            return quota
        self.usage.count(quota.label, group, "refused")
        raise refusal(breach)

    @contextlib.asynccontextmanager
    async def place(self, group: str, quota: Quota) -> AsyncIterator[None]:
        """Its place in the engines of `group` (at once where the admission queue is off)."""
        if self.admission is None:
            yield
            return
        gauge = self.usage.queued.labels(group)
        gauge.inc()
        entered = False
        try:
            async with self.admission.place(group, quota.flow, quota.klass, max(quota.estimate, 1),
                                            quota.weight) as waited:  # fmt: skip
                entered = True
                gauge.dec()
                quota.waited_s = waited
                yield
        except OverLimit as exc:  # its queue is full, or it waited too long: it used nothing of its limits
            quota.refused = True
            if quota.hold is not None:
                quota.hold.settle(0)
            self.usage.count(quota.label, group, "refused")
            raise refusal(exc) from None
        finally:
            if not entered:
                gauge.dec()

    # -- after ------------------------------------------------------------------------------------------
    def answered(self, quota: Quota | None, group: str, dep: Any, status: str, usage: dict | None) -> None:
        if quota is None:
            return
        tin, tout = tokens_of(usage)
        cost = self.price(dep, tin, tout) if getattr(dep, "kind", "") == "cloud" else 0.0
        used = tin + tout if usage else None
        if quota.hold is not None:
            quota.hold.settle(used, cost)
        elif quota.meter is not None:  # spilled: its totals (budgets), not its windows
            quota.meter.total_tokens += used or 0
            quota.meter.day_tokens += used or 0
            quota.meter.cost_usd += cost
        outcome = "spilled" if quota.over_limit else ("ok" if status.startswith("2") else "error")
        self.usage.count(quota.label, group, outcome, usage, cost)
        self.totals.dirty = True

    def failed(self, quota: Quota | None, group: str) -> None:
        if quota is not None and not quota.refused:
            self.usage.count(quota.label, group, "error")

    def price(self, dep: Any, tin: int, tout: int) -> float:
        """Its cost by LiteLLM's price table (imported already: a cloud deployment answered); 0 if unpriced."""
        model = getattr(dep, "upstream_model", "")
        try:
            import litellm

            a, b = litellm.cost_per_token(model=model, prompt_tokens=tin, completion_tokens=tout)
            return float(a) + float(b)
        except Exception as exc:  # a model the table does not know: counted as free, said once
            if model not in self._unpriced:
                self._unpriced.add(model)
                log.warning("no price for %s in LiteLLM's table (%s): its cost counts 0 in the usage", model,
                            type(exc).__name__)  # fmt: skip
            return 0.0

    def save(self) -> None:
        self.totals.write(self.totals.snapshot(self.limiter.meters))

    async def save_soon(self) -> None:
        """The same, its file written off the event loop."""
        await asyncio.to_thread(self.totals.write, self.totals.snapshot(self.limiter.meters))


def refusal(breach: OverLimit) -> RateLimited:
    """429 in OpenAI's shape: code `<limit>_exceeded`, the limit also in `x-vstack-limit`, and Retry-After
    where waiting helps (not for a spent budget)."""
    headers = {"x-vstack-limit": breach.limit}
    if breach.retry_after is not None:
        headers["Retry-After"] = str(breach.retry_after)
        headers["retry-after-ms"] = str(breach.retry_after_ms)
    return RateLimited(breach.message, param=breach.limit, code=f"{breach.limit}_exceeded", headers=headers)
