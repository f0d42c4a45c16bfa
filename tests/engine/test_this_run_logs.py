"""Logs are appended to across runs; errors show only this run's lines (stack.engine.diagnose.log_tail)."""

from __future__ import annotations

import json
from pathlib import Path

from stack.cli.lifecycle import _failure
from stack.engine.diagnose import log_size, log_tail
from stack.errors import EngineError, ReportedError


def test_log_tail_starts_at_this_runs_first_byte(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("old run\nold error\n")
    start = log_size(log)
    with open(log, "a") as f:
        f.write("new run\n")
    assert log_tail(log, start=start) == "new run"
    assert "old error" in log_tail(log)
    assert log_size(tmp_path / "missing.log") == 0


def test_a_reported_failure_keeps_its_exit_code(tmp_path: Path) -> None:
    failure = tmp_path / "failure.json"
    failure.write_text(json.dumps({"message": "m", "hint": "h", "log_tail": "", "exit_code": 6}))
    exc = _failure(failure, 6, tmp_path / "gateway.log", 0)
    assert isinstance(exc, ReportedError) and exc.exit_code == 6 and exc.hint == "h"


def test_a_crashed_gateway_shows_only_this_runs_log_lines(tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    log.write_text("old run's traceback\n")
    start = log_size(log)
    with open(log, "a") as f:
        f.write("Segmentation fault\n")
    exc = _failure(tmp_path / "no-failure-file.json", -11, log, start)
    assert isinstance(exc, EngineError) and exc.exit_code == 3
    assert exc.log_tail == "Segmentation fault"
