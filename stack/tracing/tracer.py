"""The gateway's (and the manager's) one tracer: starts a request's trace, and once it is over keeps it for the
console (a bounded buffer of the last `keep` traces) and exports it when it is sampled and a collector is
configured. A gateway with neither has no tracer at all (None): its request path makes no tracing call."""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from stack.tracing.record import Frozen, RequestTrace, view
from stack.tracing.settings import Tracing

log = logging.getLogger("stack.tracing")


class TraceBuffer:
    """The last `size` finished traces by trace id (oldest dropped first), and their activity ids; each kept
    frozen (RequestTrace.freeze: plain tuples the garbage collector does not walk)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._traces: OrderedDict[str, Frozen] = OrderedDict()
        self._by_activity: dict[int, str] = {}

    def add(self, trace: RequestTrace) -> None:
        key = trace.id
        self._traces[key] = trace.freeze()
        if trace.activity_id is not None:
            self._by_activity[trace.activity_id] = key
        while len(self._traces) > self.size:
            _, old = self._traces.popitem(last=False)
            if old[1] is not None:
                self._by_activity.pop(old[1], None)

    def get(self, key: str) -> dict | None:
        """Its view (record.view) by trace id (32 hex digits) or by the Activity log's request id."""
        if key.isdigit() and len(key) < 32:
            key = self._by_activity.get(int(key), "")
        frozen = self._traces.get(key.lower())
        return view(frozen) if frozen is not None else None

    def views(self) -> list[dict]:
        """Every kept trace, oldest first."""
        return [view(f) for f in self._traces.values()]

    def __len__(self) -> int:
        return len(self._traces)


class Tracer:
    def __init__(self, settings: Tracing, exporter: Any = None, scope: str = "stack.gateway") -> None:
        self.settings = settings
        self.ratio = settings.ratio if settings.exporting else 0.0  # unsampled: vLLM records nothing for it
        self.buffer = TraceBuffer(settings.keep) if settings.keep else None
        self.exporter = exporter
        if exporter is None and settings.exporting:
            from stack.tracing.export import Exporter  # the SDK is imported only by a gateway that exports

            self.exporter = Exporter(settings, scope)
            log.info("tracing: exporting %s of requests to %s (%s)", f"{self.ratio:.0%}", settings.endpoint,
                     settings.protocol)  # fmt: skip

    def start(self, name: str, start: int, traceparent: str | None = None, **attrs: Any) -> RequestTrace:
        return RequestTrace(name, start, self.ratio, traceparent, attrs)

    def finish(self, trace: RequestTrace) -> None:
        """The request is over: its root ends now (unless it already has), kept and exported."""
        trace.root.close()
        if self.buffer is not None:
            self.buffer.add(trace)
        if self.exporter is not None and trace.sampled:
            try:
                self.exporter.export(trace)
            except Exception:  # a tracing failure never fails a request
                log.exception("tracing: exporting trace %s failed", trace.id)

    def flush(self, timeout_s: float = 5) -> bool:
        return self.exporter.flush(timeout_s) if self.exporter is not None else True

    def close(self) -> None:
        if self.exporter is not None:
            self.exporter.close()


def tracer_for(settings: Tracing | None) -> Tracer | None:
    """None where there is nothing to do: no export and no buffer."""
    if settings is None or (not settings.exporting and not settings.keep):
        return None
    return Tracer(settings)
