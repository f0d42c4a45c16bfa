"""Engine control calls share one client per process (stack.engine.control_client, adr/0035): built once (an
httpx client reads the CA bundle, ~50 ms here), shared by the manager's threads, its idle connections dropped
before an engine's server would close them. A real HTTP server on loopback answers."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from stack.engine.control_client import control_client


class Health(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_one_client_for_every_thread_and_its_idle_connections_expire_early() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/health"
    try:
        with ThreadPoolExecutor(8) as pool:
            clients = list(pool.map(lambda _: control_client(), range(8)))
            codes = list(pool.map(lambda _: control_client().get(url, timeout=2).status_code, range(32)))
        assert all(c is clients[0] for c in clients) and codes == [200] * 32
        assert control_client()._transport._pool._keepalive_expiry <= 1.0  # the engine's server closes at 5 s
        time.sleep(1.2)
        assert control_client().get(url, timeout=2).status_code == 200  # a fresh connection, not a stale one
    finally:
        server.shutdown()
