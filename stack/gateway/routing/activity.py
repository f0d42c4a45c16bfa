"""The last requests the gateway answered, for the console's Activity page: a bounded ring, no bodies, no keys.

Fed by the dispatcher where it counts `vstack_gateway_requests` (stack.gateway.routing.dispatcher), and with the
requests refused before routing (route `refused`: a wrong key, a body that does not parse, an unknown model, a
model of another task; stack.gateway.http.error_handlers and the dispatcher), which `vstack_gateway_rejected_requests`
counts: a user looking for a request they sent finds it. Each record is built from a fixed list of fields, never
from the request: model, route, status, TTFT, tokens in/out, duration, why (the refusal's code).
"""

from __future__ import annotations

import csv
import io
import itertools
import time
from collections import deque
from dataclasses import asdict, dataclass

FIELDS = ("id", "ts", "endpoint", "model", "deployment", "route", "status", "ttft_ms", "tokens_in", "tokens_out",
          "duration_ms", "why", "tenant")  # fmt: skip


@dataclass(frozen=True)
class Activity:
    id: int
    ts: float
    endpoint: str
    model: str
    deployment: str
    route: str  # local, replica, cloud, fallback:<reason>, spilled (switching), spilled:slo, - (none answered), refused
    status: str
    ttft_ms: float | None
    tokens_in: int | None
    tokens_out: int | None
    duration_ms: float
    why: str = ""  # for a model with a TTFT objective: the estimate that sent it where it went
    trace_id: str = ""  # its spans (the console's waterfall, a collector), when tracing is on (adr/0042)
    tenant: str = ""  # the named key that sent it (stack.gateway.tenants); "" for other keys


class ActivityRing:
    """The last `size` requests. Adding one is all a request pays: the console reads new ones once a second."""

    def __init__(self, size: int = 1000) -> None:
        self._ring: deque[Activity] = deque(maxlen=size)
        self._ids = itertools.count(1)
        self.latest = 0

    def add(self, *, endpoint: str, model: str, deployment: str, route: str, status: str, started: float,
            ttft_s: float | None = None, usage: dict | None = None, why: str = "",
            trace_id: str = "", tenant: str = "") -> Activity:  # fmt: skip
        usage = usage or {}
        tin = usage.get("prompt_tokens", usage.get("input_tokens"))
        tout = usage.get("completion_tokens", usage.get("output_tokens"))
        rec = Activity(next(self._ids), round(time.time(), 3), endpoint, model, deployment, route, status,
                       None if ttft_s is None else round(ttft_s * 1000, 1),
                       tin if isinstance(tin, int) else None, tout if isinstance(tout, int) else None,
                       round((time.perf_counter() - started) * 1000, 1), why, trace_id, tenant)  # fmt: skip
        self._ring.append(rec)
        self.latest = rec.id
        return rec

    def before(self, ts: float) -> int:
        """The id of the newest record older than `ts` (0: none)."""
        return next((r.id for r in reversed(self._ring) if r.ts < ts), 0)

    def since(self, last_id: int, limit: int = 200) -> list[dict]:
        """Records after `last_id`, oldest first (at most the newest `limit`)."""
        new = [asdict(r) for r in reversed(self._ring) if r.id > last_id][:limit]
        return new[::-1]

    def last(self, model: str | None = None, status: str | None = None, limit: int = 200) -> list[dict]:
        """Newest first; status `ok` = 2xx, `error` = everything else, else an exact status."""
        out = []
        for rec in reversed(self._ring):
            if model and rec.model != model:
                continue
            ok = rec.status.startswith("2")
            if (status == "ok" and not ok) or (status == "error" and ok):
                continue
            if status not in (None, "", "ok", "error") and rec.status != status:
                continue
            out.append(asdict(rec))
            if len(out) >= limit:
                break
        return out


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
