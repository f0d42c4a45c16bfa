"""The floor under an HTTP proxy on the gateway's own libraries: uvicorn (uvloop, httptools) serving a bare ASGI
app that posts each request's body to one upstream with a pooled aiohttp session and relays the answer's chunks.

    python bench/harness/http_floor.py --port 9201 --target http://127.0.0.1:9100

No checks, no routing, no counting, no middleware: what the gateway's stack costs before any of its own work.
bench/gateway_overhead.py runs it as its target "http-floor" (`--floor`) beside "floor" (bytes only, no HTTP)
and the gateway: the gateway's added latency minus this one's is what the gateway's own code adds; this one's
minus the byte floor's is what parsing and writing HTTP twice in Python costs on the machine.
"""

from __future__ import annotations

import argparse

import aiohttp
import uvicorn

HEADERS = [(b"content-type", b"text/event-stream")]


class HttpFloor:
    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                if message["type"] == "lifespan.startup":
                    self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                                         auto_decompress=False)  # fmt: skip
                    await send({"type": "lifespan.startup.complete"})
            assert self.session is not None
            await self.session.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        assert self.session is not None
        async with self.session.post(self.target + scope["path"], data=body,
                                     headers={"Content-Type": "application/json"}) as resp:  # fmt: skip
            await send({"type": "http.response.start", "status": resp.status, "headers": HEADERS})
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--target", required=True, help="the upstream's base URL")
    args = ap.parse_args()
    uvicorn.run(HttpFloor(args.target), host="127.0.0.1", port=args.port, loop="uvloop", http="httptools",
                access_log=False, log_level="warning")


if __name__ == "__main__":
    main()
