"""`vstack up` exits with the failure's own code (docs/reference/exit-codes.md), not 3 for everything the gateway
it starts in the background reports, and shows only this run's log lines. Nothing here starts an engine:
each failure happens while planning, before any engine would start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="`vstack up` reads the installed vLLM's options")

OLD = "an earlier run's line that must never be shown"


def up(tmp_path: Path, config: str, *args: str) -> subprocess.CompletedProcess[str]:
    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True, exist_ok=True)
    (state / "logs" / "gateway.log").write_text(f"{OLD}\nTraceback (most recent call last): old\n")
    path = tmp_path / "vstack.yaml"
    path.write_text(config)
    env = {**os.environ, "VSTACK_STATE_DIR": str(state), "VSTACK_GATEWAY__PORT": "0", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "stack.entrypoints.cli", "--config", str(path), "up", *args],
                          env=env, text=True, capture_output=True, timeout=300, check=False)


@pytest.mark.parametrize(("config", "args", "code", "says"), [
    ("engine:\n  no_such_option: 1\n", (), 2, "engine.no_such_option"),
    ("models:\n  ghost:\n    source: {path: /nonexistent/ghost-model}\n", ("ghost",), 4, "/nonexistent/ghost-model"),
    ("engine:\n  max_model_len: 100000000\n", (), 6, "100000000 was asked for"),
], ids=["unknown-engine-option", "missing-model-path", "context-beyond-the-model"])
def test_up_exits_with_the_failures_own_code(tmp_path: Path, config: str, args: tuple[str, ...], code: int,
                                             says: str) -> None:  # fmt: skip
    proc = up(tmp_path, config, *args)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert says in proc.stderr
    assert OLD not in proc.stderr + proc.stdout and "Traceback" not in proc.stderr
    assert "last engine log lines" not in proc.stderr  # no engine started: no engine log to show


def test_already_running_has_its_own_exit_code(tmp_path: Path) -> None:
    """Nothing failed and nothing started: not 3 (an engine failed) as before."""
    from stack.engine.records import EngineRecord, RecordStore
    from stack.errors import ExitCode

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        RecordStore(tmp_path / "state").save(EngineRecord("gateway", "auto", sleeper.pid, "127.0.0.1", 1, ""))
        proc = up(tmp_path, "")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert proc.returncode == ExitCode.ALREADY_RUNNING == 12, proc.stdout + proc.stderr
    assert "already running" in proc.stderr and "vstack down" in proc.stderr


def test_port_in_use_has_its_own_exit_code(tmp_path: Path) -> None:
    import socket

    from stack.errors import ExitCode

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = up(tmp_path, "", "--port", str(port))
    assert proc.returncode == ExitCode.PORT_IN_USE == 13, proc.stdout + proc.stderr
    assert f"port {port}" in proc.stderr and "in use" in proc.stderr


def test_the_sample_request_answers_in_a_sentence_and_names_the_key_variable(monkeypatch) -> None:
    from stack.cli.lifecycle import _sample_request, key_variable
    from stack.config import load_config

    monkeypatch.delenv("VSTACK_API_KEY", raising=False)
    cfg = load_config()
    assert key_variable(cfg) is None
    plain = _sample_request("http://127.0.0.1:8000", "smollm2-135m-instruct", key_variable(cfg))
    assert '"temperature": 0' in plain and "Authorization" not in plain
    monkeypatch.setenv("VSTACK_API_KEY", "sk-secret-value")
    keyed = _sample_request("http://127.0.0.1:8000", "smollm2-135m-instruct", key_variable(load_config()))
    assert 'Authorization: Bearer $VSTACK_API_KEY' in keyed and "sk-secret-value" not in keyed
