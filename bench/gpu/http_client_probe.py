"""What the switch bench's clock held until adr/0055: an HTTP client built per call (`httpx.post()`, SSL context
included) against one client made first, each opening its own connection to a local server; on this machine.

    python3 -m bench.gpu.http_client_probe        (the lent machine's own Python has httpx; no site, no GPU)
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx


class Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = b'data: {"choices":[{"text":"a"}]}\n\n'
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/completions"
    shared = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))

    def per_call() -> float:
        t = time.perf_counter()
        httpx.post(url, json={"prompt": "t5"}, timeout=10).raise_for_status()
        return time.perf_counter() - t

    def made_first() -> float:
        t = time.perf_counter()
        shared.post(url, json={"prompt": "t5"}, timeout=10).raise_for_status()
        return time.perf_counter() - t

    out = {}
    for name, fn in (("client_per_call_ms", per_call), ("client_made_first_ms", made_first)):
        fn()
        out[name] = round(statistics.median(fn() for _ in range(30)) * 1000, 2)
    print("HTTP_CLIENT_PROBE " + json.dumps({**out, "httpx": httpx.__version__}), flush=True)


if __name__ == "__main__":
    main()
