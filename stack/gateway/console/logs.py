"""The Logs page: the gateway's own log records (a bounded ring fed by a logging handler) and each engine's
log file, followed from where the page opened. Lines pass stack.gateway.upstreams.cloud_client.scrub
(key-like words masked)."""

from __future__ import annotations

import itertools
import logging
from collections import deque
from pathlib import Path

from stack.gateway.upstreams.cloud_client import scrub

MAX_READ = 64 * 1024  # per file per tick: a burst of engine output cannot stall the ticker


def clean(line: str) -> str:
    return scrub(line, None) if len(line) <= 500 else scrub(line[:2000], None)[:500] + " …"


class GatewayLog(logging.Handler):
    """The last `size` records of this process's loggers (stack.*, uvicorn), numbered for followers."""

    def __init__(self, size: int = 1000) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        self.lines: deque[tuple[int, str]] = deque(maxlen=size)
        self.times: deque[tuple[int, float, None]] = deque(maxlen=size)
        self._seq = itertools.count(1)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            return
        for line in text.splitlines()[:20]:
            n = next(self._seq)
            self.lines.append((n, clean(line)))  # deque.append is thread-safe
            self.times.append((n, record.created, None))

    def before(self, ts: float) -> int:
        """The number of the last line written before `ts` (a page opening now read the ones after it too)."""
        return next((n for n, t, _ in reversed(self.times) if t < ts), 0)

    def since(self, seq: int) -> tuple[int, list[str]]:
        new = [(n, line) for n, line in list(self.lines) if n > seq]
        return (new[-1][0] if new else seq), [line for _, line in new]


def tail(path: Path, lines: int = 200) -> tuple[int, list[str]]:
    """The last lines of a file and the offset after them (where following starts)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            end = f.tell()
            f.seek(max(0, end - MAX_READ))
            text = f.read().decode(errors="replace")
    except OSError:
        return 0, []
    return end, [clean(x) for x in text.splitlines()[-lines:]]


def follow(path: Path, offset: int) -> tuple[int, list[str]]:
    """Whole lines written since `offset` (a file that shrank, e.g. a new engine's log, starts again at 0)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            end = f.tell()
            if end < offset:
                offset = 0
            f.seek(offset)
            raw = f.read(MAX_READ)
    except OSError:
        return offset, []
    cut = raw.rfind(b"\n")
    if cut < 0:
        return offset, []
    text = raw[: cut + 1].decode(errors="replace")
    return offset + cut + 1, [clean(x) for x in text.splitlines()]
