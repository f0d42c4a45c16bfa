"""A real OTLP/HTTP trace receiver in a thread: it stands in for the external collector (Jaeger, Tempo, an
OpenTelemetry Collector) that a deployment points `observability.tracing.endpoint` at. It speaks the
protocol itself (POST /v1/traces, a protobuf `ExportTraceServiceRequest`, decoded with opentelemetry-proto)
and keeps every span it received, flattened: what a test asserts on, and the bench's export target."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class ReceivedSpan:
    service: str
    scope: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    status_code: int = 0


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else str(v)


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out = []
    for rs in request.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(ReceivedSpan(
                    str(resource.get("service.name", "")), ss.scope.name, s.name, s.trace_id.hex(), s.span_id.hex(),
                    s.parent_span_id.hex(), s.kind, s.start_time_unix_nano, s.end_time_unix_nano,
                    {a.key: _value(a.value) for a in s.attributes}, [e.name for e in s.events], s.status.code,
                ))  # fmt: skip
    return out


class Receiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.headers: list[dict[str, str]] = []  # each export's request headers (an exporter's API key)
        self._lock = threading.Lock()

    def add(self, spans: list[ReceivedSpan], headers: dict[str, str]) -> None:
        with self._lock:
            self.spans.extend(spans)
            self.headers.append(headers)

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, trace_id: str, count: int = 1, service: str | None = None,
                 timeout_s: float = 30) -> list[ReceivedSpan]:  # fmt: skip
        """The trace's spans once `count` of them (of `service`, if given) have arrived."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = [s for s in self.of_trace(trace_id) if service is None or s.service == service]
            if len(spans) >= count or time.monotonic() > deadline:
                return spans
            time.sleep(0.05)


@contextlib.contextmanager
def otlp_receiver(port: int = 0) -> Iterator[tuple[str, Receiver]]:
    """Yields (its base URL, http://127.0.0.1:PORT, and what it received); port 0: a free one."""
    received = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = f'{{"spans": {len(received.spans)}}}'.encode()  # /health: alive, and how many it got
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            received.add(decode(body), {k.lower(): v for k, v in self.headers.items()})
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    with otlp_receiver(args.port):
        threading.Event().wait()


if __name__ == "__main__":
    main()
