"""The floor under any proxy: a TCP proxy that forwards bytes both ways and does nothing else.

    python bench/harness/byte_proxy.py --port 9200 --target 127.0.0.1:9100

bench/gateway_overhead.py puts it in front of the paced upstream as its target "floor": what one more process
between client and upstream costs on this machine (its wake-ups and its socket writes, no HTTP at all). On a
busy 2-core machine that floor is milliseconds, and the gateway's added latency reads against it.
Built on asyncio protocols (uvloop when installed), each connection's bytes written as they arrive.
"""

from __future__ import annotations

import argparse
import asyncio


class _Side(asyncio.Protocol):
    """One end of a forwarded connection; bytes that arrive before the other end is connected wait."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.peer is None or self.peer.transport is None:
            self.early.append(data)
        else:
            self.peer.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


class _Client(_Side):
    def __init__(self, host: str, port: int) -> None:
        super().__init__()
        self.host, self.port = host, port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(_Side, self.host, self.port)
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        upstream.peer, self.peer = self, upstream
        for data in self.early:
            upstream.transport.write(data)
        self.early.clear()


async def serve(port: int, host: str, target_port: int) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: _Client(host, target_port), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--target", required=True, help="HOST:PORT to forward to")
    args = ap.parse_args()
    host, _, port = args.target.rpartition(":")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.port, host, int(port)))


if __name__ == "__main__":
    main()
