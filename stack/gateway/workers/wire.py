"""Framing of the owner <-> worker channel (a unix socket): each message a JSON head and raw bytes (a body,
a payload), both length-prefixed. orjson both ways; no pickle crosses the socket."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import orjson

HEAD = struct.Struct("!II")


def frame(head: dict[str, Any], data: bytes = b"") -> bytes:
    encoded = orjson.dumps(head)
    return HEAD.pack(len(encoded), len(data)) + encoded + data


async def read(reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytes]:
    """The next message; asyncio.IncompleteReadError when the other side closed the channel."""
    head_len, data_len = HEAD.unpack(await reader.readexactly(HEAD.size))
    head = orjson.loads(await reader.readexactly(head_len))
    data = await reader.readexactly(data_len) if data_len else b""
    return head, data
