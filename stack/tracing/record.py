"""A request's spans as plain records: names, ids, wall-clock nanoseconds and attributes.

The request path only takes timestamps and appends small objects here (a few microseconds per request, see
bench/gateway_overhead.py --tracing); turning them into OpenTelemetry spans and exporting them happens once
the request is over (stack.tracing.export), off the path to the client. The ids are made here, as the OTel
SDK makes them (random bits), so that the W3C `traceparent` sent to an engine names the very span the
gateway exports later: one trace across the gateway and vLLM.
"""

from __future__ import annotations

import random
import re
import time
from typing import Any

clock = time.time_ns  # OTLP's timestamps: nanoseconds since the epoch

INTERNAL, SERVER, CLIENT = "internal", "server", "client"
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_RATIO_BOUND = 1 << 64


class Span:
    __slots__ = ("attrs", "end", "error", "events", "kind", "name", "parent_id", "span_id", "start")

    def __init__(self, name: str, span_id: int, parent_id: int | None, start: int, kind: str,
                 attrs: dict[str, Any]) -> None:  # fmt: skip
        self.name, self.span_id, self.parent_id, self.start, self.kind = name, span_id, parent_id, start, kind
        self.end: int | None = None
        self.attrs = attrs
        self.events: list[tuple[str, int]] = []
        self.error: str | None = None  # error.type, when the phase failed

    def close(self, error: str | None = None, **attrs: Any) -> None:
        if self.end is None:
            self.end = clock()
        if error is not None:
            self.error = error
        if attrs:
            self.attrs.update(attrs)

    def event(self, name: str) -> None:
        self.events.append((name, clock()))


class RequestTrace:
    """One request's spans; the first is the root (the request as the gateway served it)."""

    __slots__ = ("activity_id", "remote_parent", "root", "sampled", "spans", "trace_id")

    def __init__(self, name: str, start: int, ratio: float, traceparent: str | None = None,
                 attrs: dict[str, Any] | None = None) -> None:  # fmt: skip
        parent = _TRACEPARENT.match(traceparent.strip().lower()) if traceparent else None
        if parent is not None and int(parent[1], 16) and int(parent[2], 16):  # a client's trace: continued
            self.trace_id, self.remote_parent = int(parent[1], 16), int(parent[2], 16)
            self.sampled = bool(int(parent[3], 16) & 1)
        else:
            self.trace_id, self.remote_parent = random.getrandbits(128) or 1, None
            # OTel's TraceIdRatioBased rule on the id's low 64 bits: a collector's tail sampler agrees with it
            self.sampled = (self.trace_id & (_RATIO_BOUND - 1)) < ratio * _RATIO_BOUND
        self.root = Span(name, _span_id(), self.remote_parent, start, SERVER, attrs or {})
        self.spans = [self.root]
        self.activity_id: int | None = None

    def span(self, name: str, start: int | None = None, parent: Span | None = None, kind: str = INTERNAL,
             **attrs: Any) -> Span:  # fmt: skip
        span = Span(name, _span_id(), (parent or self.root).span_id, clock() if start is None else start, kind, attrs)
        self.spans.append(span)
        return span

    def traceparent(self, span: Span) -> str:
        """The W3C header naming `span` as the parent of what the upstream does."""
        return f"00-{self.trace_id:032x}-{span.span_id:016x}-{'01' if self.sampled else '00'}"

    @property
    def id(self) -> str:
        return f"{self.trace_id:032x}"

    def freeze(self) -> Frozen:
        """The finished trace as nested tuples of plain values: what the console's buffer keeps. The garbage
        collector stops tracking such tuples, so hundreds of kept traces add nothing to its passes (as
        objects they did: +0.04 ms of CPU per request at 500 kept, bench/gateway_cpu.py)."""
        spans = tuple((s.name, s.span_id, s.parent_id, s.start, s.end, s.kind, s.error, tuple(s.attrs.items()),
                       tuple(s.events)) for s in self.spans)  # fmt: skip
        return (self.id, self.activity_id, self.sampled, spans)

    def view(self) -> dict[str, Any]:
        return view(self.freeze())


Frozen = tuple  # (trace id, activity id, sampled, spans: (name, id, parent, start, end, kind, error, attrs, events))


def view(frozen: Frozen) -> dict[str, Any]:
    """As the console's waterfall reads it: milliseconds from the request's start (`start_ns`: that start)."""
    trace_id, activity_id, sampled, spans = frozen
    origin = spans[0][3]
    now = clock()
    out = []
    for name, span_id, parent_id, start, end, kind, error, attrs, events in spans:
        end = end if end is not None else now
        out.append({"name": name, "span_id": f"{span_id:016x}", "parent_id": f"{parent_id:016x}" if parent_id else None,
                    "kind": kind, "start_ms": round((start - origin) / 1e6, 3),
                    "duration_ms": round((end - start) / 1e6, 3), "attributes": dict(attrs), "error": error,
                    "events": [{"name": n, "at_ms": round((t - origin) / 1e6, 3)} for n, t in events]})  # fmt: skip
    return {"trace_id": trace_id, "activity_id": activity_id, "sampled": sampled, "start_ns": origin, "spans": out}


def _span_id() -> int:
    return random.getrandbits(64) or 1
