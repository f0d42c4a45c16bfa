"""What one `vstack up` did, counted across its processes: each configuration load, hardware detection and
model plan appends a line to $VSTACK_COUNT_FILE when it is set (the test that proves each happens once,
tests/cli/test_up_plans_once_e2e.py). Unset, it costs one dictionary look-up."""

from __future__ import annotations

import os

COUNT_ENV = "VSTACK_COUNT_FILE"


def count(event: str, detail: str = "") -> None:
    """One line, `PID EVENT DETAIL`, appended in one write (O_APPEND: lines of several processes never mix)."""
    path = os.environ.get(COUNT_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{os.getpid()} {event} {detail}".rstrip().encode() + b"\n")
    finally:
        os.close(fd)
