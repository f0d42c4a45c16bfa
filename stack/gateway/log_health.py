"""The gateway's own log, watched: a line that cannot be written (a full disk: ENOSPC) is counted, not lost
in silence.

Python's logging swallows write errors (it prints a traceback to stderr, which is the same full file). The
handler installed here records each failed line instead: the count, the error and since when, shown by
/health (`degraded`), /admin/models (`gateway.log`), `vstack status` and the metric
vstack_gateway_log_write_failures_total. Once writing works again, its first line says how many lines
were lost, and when. A line goes to a log file in one piece or not at all (a full disk never leaves half a
line glued to the next one).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class WatchedLogHandler(logging.StreamHandler):
    """A StreamHandler that remembers its write failures (and tells of them once it can write again)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        super().__init__(stream or sys.stderr)
        self.failures = 0  # lines lost since the start
        self.lost = 0  # lines lost since the last line that was written
        self.error = ""
        self.since: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.lost:
            note = logging.LogRecord(record.name, logging.ERROR, __file__, 0, "%d log lines were lost since %s: %s",
                                     (self.lost, time.strftime("%H:%M:%S", time.localtime(self.since)), self.error),
                                     None)  # fmt: skip
            if not self._write(note):
                self._lost(record)
                return
            self.lost, self.since = 0, None
        if not self._write(record):
            self._lost(record)

    def _write(self, record: logging.LogRecord) -> bool:
        try:
            line = self.format(record) + self.terminator
            fd = self._file()
            if fd is None:
                self.stream.write(line)
                self.flush()
            else:
                self.flush()  # what others printed to the stream goes first, then this line in one piece
                whole_line(fd, line.encode("utf-8", "backslashreplace"))
            return True
        except OSError as exc:
            self.error = f"{exc.strerror or type(exc).__name__} (errno {exc.errno})"
            return False
        except Exception as exc:  # a closed stream (ValueError), an encoding error: a handler never raises
            self.error = f"{type(exc).__name__}: {exc}"[:200]  # into the request that logged (logging's own rule)
            return False

    def _file(self) -> int | None:
        """The stream's descriptor when it is a regular file (a log file; a line there is kept whole), else None."""
        try:
            fd = self.stream.fileno()
            return fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
        except (AttributeError, OSError, ValueError):
            return None

    def _lost(self, _record: logging.LogRecord) -> None:
        self.failures += 1
        self.lost += 1
        self.since = self.since or time.time()

    def flush(self) -> None:
        # StreamHandler.flush swallows nothing: a full disk raises here, and _write counts it.
        if self.stream and hasattr(self.stream, "flush"):
            self.stream.flush()

    def status(self) -> dict[str, Any] | None:
        """None while every line is written; else what is lost and why."""
        if not self.lost:
            return None
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.since))
        return {"lines_lost": self.lost, "error": self.error, "since": since}


def whole_line(fd: int, data: bytes) -> None:
    """Append `data` to the file, whole or not at all: a full disk that takes half of it has the half cut off
    again (ftruncate to where it began), so no half line is left to be glued to the next one (adr/0039)."""
    start = os.lseek(fd, 0, os.SEEK_END)
    done = 0
    try:
        while done < len(data):
            done += os.write(fd, data[done:])
    except OSError:
        if done:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
        raise


class LogFailures(Collector):
    """vstack_gateway_log_write_failures_total, read from the handler at scrape time."""

    def __init__(self, handler: WatchedLogHandler) -> None:
        self.handler = handler

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("vstack_gateway_log_write_failures", "Gateway log lines that could not be "
                                     "written (a full disk, ENOSPC)")  # fmt: skip
        family.add_metric([], self.handler.failures)
        yield family


def install(level: int = logging.INFO, stream: IO[str] | None = None) -> WatchedLogHandler:
    """The root logger's one handler (what logging.basicConfig would set up), watched."""
    handler = WatchedLogHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):  # only basicConfig's kind: others (a test runner's capture) stay
        if type(old) in (logging.StreamHandler, WatchedLogHandler):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
