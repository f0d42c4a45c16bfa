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
