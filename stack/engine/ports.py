"""Ports for the engines' sockets, drawn where no other socket is handed one.

A port the kernel hands out (bind to 0) is free only until the next socket that asks for any port: every outgoing
connection and vLLM's own ZMQ sockets draw from the kernel's ephemeral range, and CI saw one take a Ray replica's
KV-event port between its pick and vLLM's bind (zmq "Address already in use", the replica failed to start). Ports
here come from below that range and above Ray's worker ports (10002-19999 by default), checked free by binding.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

PORTS_FROM = 20000


def ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(host: str = "127.0.0.1", tries: int = 64) -> int:
    """A port free on `host` now, drawn at random below the ephemeral range; the kernel's pick if none of `tries`
    is free there."""
    top = ephemeral_start()
    for _ in range(tries if top > PORTS_FROM else 0):
        port = random.randrange(PORTS_FROM, top)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
