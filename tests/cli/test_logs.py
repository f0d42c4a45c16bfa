"""`vstack logs [MODEL] [-f]` on the log files `vstack up` writes (state_dir/logs), and the detached gateway
not telling anyone to press Ctrl-C."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from stack.cli.gateway_process import NoCtrlCHint
from stack.cli.logs_cmd import follow


def vstack(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stack.entrypoints.cli", "logs", *args], text=True,
                          capture_output=True, timeout=60, check=False,
                          env={**os.environ, "VSTACK_STATE_DIR": str(state)})


def state_with_logs(tmp_path: Path) -> Path:
    logs = tmp_path / "state" / "logs"
    (logs / "Qwen").mkdir(parents=True)
    (logs / "gateway.log").write_text("".join(f"gateway line {i}\n" for i in range(100)))
    (logs / "smollm2-135m-instruct.log").write_text("engine says hello\n")
    (logs / "Qwen" / "Qwen2.5-0.5B-Instruct.log").write_text("a Hub id's engine\n")  # served names hold a slash
    return tmp_path / "state"


def test_logs_shows_the_gateway_or_a_models_engine(tmp_path: Path) -> None:
    state = state_with_logs(tmp_path)
    gateway = vstack(state, "-n", "3")
    assert gateway.returncode == 0 and gateway.stdout.split() == ["gateway", "line", "97", "gateway", "line", "98",
                                                                  "gateway", "line", "99"]  # fmt: skip
    assert "engine says hello" in vstack(state, "smollm2-135m-instruct").stdout
    assert "a Hub id's engine" in vstack(state, "Qwen/Qwen2.5-0.5B-Instruct").stdout


def test_logs_of_a_model_without_one_says_which_exist(tmp_path: Path) -> None:
    proc = vstack(state_with_logs(tmp_path), "smollm2-135m-instrct")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "did you mean 'smollm2-135m-instruct'" in proc.stderr
    nothing = vstack(tmp_path / "empty")
    assert nothing.returncode == 1 and "docker compose logs" in nothing.stderr


def test_follow_prints_what_is_appended_and_survives_a_rotated_log(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("old\n")
    printed: list[str] = []
    done = threading.Event()
    thread = threading.Thread(target=follow, args=(log, log.stat().st_size, printed.append, 0.05, done.is_set))
    thread.start()
    with open(log, "a") as f:
        f.write("new line\n")
    time.sleep(0.3)
    log.rename(tmp_path / "engine.log.1")  # rotated: a new file under the name, longer than what was read
    log.write_text("after rotation, a longer line\n")
    time.sleep(0.3)
    done.set()
    thread.join(5)
    assert "".join(printed) == "new line\nafter rotation, a longer line\n"


def test_a_detached_gateway_does_not_say_press_ctrl_c() -> None:
    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1,
                               "Uvicorn running on %s://%s:%d (Press CTRL+C to quit)", ("http", "127.0.0.1", 8000),
                               None)  # fmt: skip
    assert NoCtrlCHint().filter(record)
    assert record.getMessage() == "Uvicorn running on http://127.0.0.1:8000"
