"""What each tenant used, per model: for /metrics, the console's Usage page and the CSV/JSON export.

Prometheus series carry only bounded labels: the named keys' names (every other request is `other`) and
model groups (the configuration's and those added through /admin; `-` for a request refused before its model
was known). A revoked key's series go with it. The table behind the Usage page keeps totals since start and
per-minute token counts for the last 24 hours; the budgets' totals are kept in state_dir/usage.json across
restarts (written at most every few seconds, and at shutdown).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import os
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from stack.gateway.tenants.limits import Meter

log = logging.getLogger("stack.gateway.tenants")
OUTCOMES = ("ok", "error", "refused", "spilled")
EXPORT_FIELDS = ("tenant", "model", "requests", "errors", "refused", "spilled", "tokens_in", "tokens_out",
                 "cost_usd")  # fmt: skip
MINUTES = 24 * 60


@dataclass
class Row:
    tenant: str
    model: str
    requests: int = 0
    errors: int = 0
    refused: int = 0
    spilled: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0


class UsageBook:
    def __init__(self, registry: CollectorRegistry, clock=time.time) -> None:
        self.clock = clock
        self.rows: dict[tuple[str, str], Row] = {}
        self.minutes: deque[tuple[int, dict[str, int]]] = deque(maxlen=MINUTES)  # (minute, tenant -> tokens)
        self.requests = Counter("vstack_gateway_tenant_requests", "Requests per named key (`other`: no named key) "
                                "and model group, by outcome: ok, error, refused (a limit, a model not allowed), "
                                "spilled (over a limit, sent to a fallback)", ["tenant", "model", "outcome"],
                                registry=registry)  # fmt: skip
        self.tokens = Counter(
            "vstack_gateway_tenant_tokens",
            "Tokens per named key and model group, by direction (prompt = in, completion = out)",
            ["tenant", "model", "direction"],
            registry=registry,
        )
        self.cost = Counter(
            "vstack_gateway_tenant_cost_usd",
            "Money spent on cloud deployments per named key and model group (LiteLLM's price table)",
            ["tenant", "model"],
            registry=registry,
        )
        self.queued = Gauge(
            "vstack_gateway_admission_waiting",
            "Requests waiting in the gateway's admission queue for a place in their model's engines",
            ["model"],
            registry=registry,
        )

    def row(self, tenant: str, model: str) -> Row:
        r = self.rows.get((tenant, model))
        if r is None:
            r = self.rows[(tenant, model)] = Row(tenant, model)
        return r

    def count(self, tenant: str, model: str, outcome: str, usage: dict | None = None, cost_usd: float = 0.0) -> None:
        r = self.row(tenant, model)
        self.requests.labels(tenant, model, outcome).inc()
        if outcome in ("ok", "spilled"):
            r.requests += 1
        r.errors += outcome == "error"
        r.refused += outcome == "refused"
        r.spilled += outcome == "spilled"
        tin, tout = tokens_of(usage)
        if tin or tout:
            r.tokens_in += tin
            r.tokens_out += tout
            self.tokens.labels(tenant, model, "prompt").inc(tin)
            self.tokens.labels(tenant, model, "completion").inc(tout)
            minute = int(self.clock() // 60)
            if not self.minutes or self.minutes[-1][0] != minute:
                self.minutes.append((minute, {}))
            bucket = self.minutes[-1][1]
            bucket[tenant] = bucket.get(tenant, 0) + tin + tout
        if cost_usd:
            r.cost_usd += cost_usd
            self.cost.labels(tenant, model).inc(cost_usd)

    def forget(self, tenant: str) -> None:
        """A revoked key: its rows and series go (its name may not come back as a label)."""
        for key in [k for k in self.rows if k[0] == tenant]:
            model = key[1]
            del self.rows[key]
            for outcome in OUTCOMES:
                with contextlib.suppress(KeyError):
                    self.requests.remove(tenant, model, outcome)
            for direction in ("prompt", "completion"):
                with contextlib.suppress(KeyError):
                    self.tokens.remove(tenant, model, direction)
            with contextlib.suppress(KeyError):
                self.cost.remove(tenant, model)

    def table(self, tenant: str | None = None) -> list[dict]:
        rows = [asdict(r) for (t, _), r in sorted(self.rows.items()) if tenant is None or t == tenant]
        for r in rows:
            r["cost_usd"] = round(r["cost_usd"], 6)
        return rows

    def series(self, tenant: str | None = None, minutes: int = 60) -> dict:
        """Tokens per minute per tenant over the last `minutes`: {"t": [unix s...], "tenants": {name: [...]}}."""
        now = int(self.clock() // 60)
        start = now - minutes + 1
        names = sorted({n for _, b in self.minutes for n in b if tenant is None or n == tenant})
        cols = {n: [0] * minutes for n in names}
        for minute, bucket in self.minutes:
            if minute >= start:
                for n, v in bucket.items():
                    if n in cols:
                        cols[n][minute - start] = v
        return {"t": [(start + i) * 60 for i in range(minutes)], "tenants": cols}


def tokens_of(usage: dict | None) -> tuple[int, int]:
    if not usage:
        return 0, 0
    tin = usage.get("prompt_tokens", usage.get("input_tokens"))
    tout = usage.get("completion_tokens", usage.get("output_tokens"))
    return (tin if isinstance(tin, int) else 0), (tout if isinstance(tout, int) else 0)


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=EXPORT_FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


class Totals:
    """The budgets' counts (tokens in all, today's, money) in state_dir/usage.json, so a restart resets none."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.dirty = False

    def load(self, meters: dict[str, Meter]) -> None:
        if self.path is None or not self.path.is_file():
            return
        try:
            data = json.loads(self.path.read_text())
            for name, t in (data.get("tenants") or {}).items():
                m = meters.setdefault(name, Meter())
                m.total_tokens, m.cost_usd = int(t.get("total_tokens", 0)), float(t.get("cost_usd", 0.0))
                m.day, m.day_tokens = str(t.get("day", "")), int(t.get("day_tokens", 0))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.error("usage totals %s unreadable (%s): budgets count from zero; the file is left as is",
                      self.path, exc)  # fmt: skip
            self.path = self.path.with_name(self.path.name + ".new")  # never overwrite what could not be read

    def snapshot(self, meters: dict[str, Meter]) -> str | None:
        """What to write (taken on the event loop, which owns the meters), or None when nothing changed."""
        if self.path is None or not self.dirty:
            return None
        self.dirty = False
        return json.dumps({"version": 1, "tenants": {n: {"total_tokens": m.total_tokens, "cost_usd": m.cost_usd,
                                                         "day": m.day, "day_tokens": m.day_tokens}
                                                     for n, m in meters.items()}})  # fmt: skip

    def write(self, body: str | None) -> None:
        if body is None or self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".usage-", dir=self.path.parent)
            with os.fdopen(fd, "w") as f:
                f.write(body)
            os.replace(tmp, self.path)
        except OSError as exc:
            self.dirty = True
            log.error("usage totals not saved to %s: %s", self.path, exc.strerror or exc)
