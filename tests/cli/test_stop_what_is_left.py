"""`vstack down` stops what is left of the gateway's tree after it exited, and only that: a pid freed in between
may name another process by then (pid_max is 32768 here, and a long test run wraps it), and signalling it would
stop a stranger and its whole process group. Real processes; the recycled pid is the one thing simulated, by
a Process handle made for an earlier process of that pid (psutil tells them apart by creation time)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from stack.cli.lifecycle import stop_what_is_left


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)


def test_a_leftover_of_the_tree_is_stopped_and_a_recycled_pid_is_not() -> None:
    leftover, stranger = sleeper(), sleeper()
    try:
        seen = psutil.Process(leftover.pid)
        recycled = psutil.Process(stranger.pid)
        # As if this handle were taken for an earlier process that had the stranger's pid, before it was reused.
        recycled._ident = (stranger.pid, recycled.create_time() - 30)  # psutil's (pid, creation time) identity

        assert stop_what_is_left([seen, recycled]) == []

        assert leftover.wait(timeout=10) is not None  # stopped
        time.sleep(0.2)
        assert stranger.poll() is None, "a process that only reused a pid of the gateway's tree was signalled"
    finally:
        for proc in (leftover, stranger):
            proc.kill()
            proc.wait()


def test_a_process_that_exited_on_its_own_is_skipped() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    handle = psutil.Process(gone.pid)
    gone.wait()
    assert stop_what_is_left([handle]) == []
