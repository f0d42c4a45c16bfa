"""An engine's ports (a local engine's HTTP port; a Ray replica's, its KV-event publisher and replay sockets, its NIXL
side channel) come from below the kernel's ephemeral range (stack.engine.ports): CI saw a port picked by bind-to-0
taken by another socket before vLLM bound its KV-event publisher there (zmq "Address already in use": the replica
failed to start). Real sockets here."""

from __future__ import annotations

import socket

from stack.engine import ports


def test_ports_come_from_below_the_ephemeral_range_and_are_free() -> None:
    top = ports.ephemeral_start()
    drawn = {ports.free_port("127.0.0.1") for _ in range(20)}
    assert all(ports.PORTS_FROM <= p < top for p in drawn)
    for port in drawn:  # free: each one binds
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_taken_port_is_not_handed_out(monkeypatch) -> None:
    """The first draw lands on a port something holds: the next free one is returned instead."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        draws = iter([taken, 20123, 20124, 20125])
        monkeypatch.setattr(ports, "ephemeral_start", lambda: max(taken + 1, 32768))
        monkeypatch.setattr(ports.random, "randrange", lambda a, b: next(draws))
        port = ports.free_port("127.0.0.1")
    assert port != taken and port in (20123, 20124, 20125)
