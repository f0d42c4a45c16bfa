"""The gateway's watched log handler never raises into the request that logged (stack.gateway.log_health).

Found by CI's order: a handler installed on a stream that was closed later (a test's captured stderr) made every
console request that logged answer 500 with `ValueError: I/O operation on closed file`."""

from __future__ import annotations

import io
import logging

from stack.gateway.log_health import WatchedLogHandler


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("stack.gateway", logging.INFO, __file__, 0, msg, None, None)


def test_a_closed_stream_is_counted_not_raised() -> None:
    stream = io.StringIO()
    handler = WatchedLogHandler(stream)
    stream.close()
    handler.emit(_record("hello"))  # raised ValueError before
    status = handler.status()
    assert status is not None and status["lines_lost"] == 1 and "ValueError" in status["error"]


def test_lines_written_again_say_how_many_were_lost() -> None:
    class Flaky(io.StringIO):
        broken = True

        def write(self, text: str) -> int:
            if self.broken:
                raise OSError(28, "No space left on device")
            return super().write(text)

    stream = Flaky()
    handler = WatchedLogHandler(stream)
    handler.emit(_record("lost"))
    stream.broken = False
    handler.emit(_record("back"))
    assert handler.status() is None
    assert "1 log lines were lost" in stream.getvalue() and "back" in stream.getvalue()


def test_install_replaces_only_basic_config_handlers() -> None:
    """Installing it kept pytest's own capture handlers off the root logger: every later caplog saw nothing."""
    from stack.gateway.log_health import install

    root = logging.getLogger()
    before = list(root.handlers)
    other = logging.FileHandler("/dev/null")
    plain = logging.StreamHandler(io.StringIO())
    root.addHandler(other)
    root.addHandler(plain)
    level = root.level
    try:
        handler = install(logging.INFO, io.StringIO())
        assert other in root.handlers and plain not in root.handlers and handler in root.handlers
    finally:
        for h in list(root.handlers):
            if h not in before:
                root.removeHandler(h)
        other.close()
        root.setLevel(level)


def test_a_full_disk_never_leaves_half_a_line(tmp_path, monkeypatch) -> None:
    """Issue 49: a disk that filled in the middle of a request-log line left its first half glued to the next
    line. The disk here takes the first 20 bytes of one line, then says ENOSPC (as a full tmpfs does)."""
    import errno
    import json
    import os

    from stack.gateway import log_health

    real_write, full = os.write, {"on": False}

    def write(fd: int, data: bytes) -> int:
        if full["on"]:
            if len(data) > 20:
                return real_write(fd, data[:20])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(log_health.os, "write", write)
    path = tmp_path / "gateway.log"
    with path.open("a") as stream:
        handler = WatchedLogHandler(stream)
        handler.emit(_record(json.dumps({"path": "/v1/chat/completions", "n": 1})))
        full["on"] = True
        handler.emit(_record(json.dumps({"path": "/v1/chat/completions", "n": 2})))
        full["on"] = False
        handler.emit(_record(json.dumps({"path": "/v1/chat/completions", "n": 3})))
    lines = path.read_text().splitlines()
    assert [json.loads(line)["n"] for line in (lines[0], lines[2])] == [1, 3]
    assert lines[1].startswith("1 log lines were lost since") and "No space left on device" in lines[1]
    assert len(lines) == 3
