"""What the CLI prints for people (80 columns, help that wraps to the terminal, completion of names) and for
scripts (--json on every listing). The real CLI in a subprocess; nothing here starts an engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stack.config import load_config


def vstack(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "VSTACK_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "80", "HF_HUB_OFFLINE": "1",
            **env}
    full.pop("VSTACK_URL", None)
    return subprocess.run([sys.executable, "-m", "stack.entrypoints.cli", *args], env=full, text=True,
                          capture_output=True, timeout=300, check=False)


@pytest.mark.parametrize(("args", "key"), [
    (("version", "--json"), "vllm_stack"),
    (("models", "list", "--json"), None),
    (("bench", "scenarios", "--json"), "scenarios"),
    (("patches", "status", "--json"), "patches"),
    (("config", "validate", "cpu-smollm2", "--json"), "profiles"),
], ids=["version", "models-list", "bench-scenarios", "patches-status", "config-validate"])
def test_json_everywhere(tmp_path: Path, args: tuple[str, ...], key: str | None) -> None:
    proc = vstack(tmp_path, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data[key] if key else data


def test_models_list_fits_80_columns_without_cutting_names(tmp_path: Path) -> None:
    proc = vstack(tmp_path, "models", "list")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in proc.stdout
    for name in load_config().models:
        assert any(name in line for line in lines), name  # whole, on one line


def test_plan_models_fits_80_columns(tmp_path: Path) -> None:
    proc = vstack(tmp_path, "plan", "--models", "llama-3.1-8b-instruct,qwen2.5-7b-instruct", "--gpu", "h100-80gb",
                  "--host-ram-gib", "64")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in proc.stdout
    assert len(lines) < 30, proc.stdout  # the "why" of each model no longer wraps over 17 lines


def test_tune_help_wraps_to_the_terminal_not_mid_sentence(tmp_path: Path) -> None:
    proc = vstack(tmp_path, "tune", "--help")
    assert proc.returncode == 0
    lines = [line.strip() for line in proc.stdout.splitlines()]
    # A source line break (at 120 columns) used to end the line here, whatever the terminal's width.
    assert not any(line.endswith("open-loop request rate at") for line in lines), proc.stdout


@pytest.mark.parametrize(("words", "expected"), [
    ("vstack up smollm2", "smollm2-135m-instruct"),
    ("vstack up cpu-", "cpu-smollm2"),
    ("vstack plan llama-3.1-8b-instruct --gpu h10", "h100-80gb"),
    ("vstack switch qwen2.5-7", "qwen2.5-7b-instruct"),
], ids=["up-model", "up-profile", "plan-gpu", "switch-model"])
def test_completion_of_names(tmp_path: Path, words: str, expected: str) -> None:
    """Through Typer's own completion protocol, as bash runs it (`vstack --install-completion`)."""
    env = {"_VSTACK_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)}
    proc = subprocess.run([sys.executable, "-c", "from stack.cli.root import app; app(prog_name='vstack')"],
                          env={**os.environ, "VSTACK_STATE_DIR": str(tmp_path), **env}, text=True,
                          capture_output=True, timeout=120, check=False)
    assert expected in proc.stdout.split(), proc.stdout + proc.stderr


def test_vstack_models_keeps_its_detail_column_and_right_border_at_80_columns(monkeypatch) -> None:
    """Issue 50: at 80 columns the table lost its detail column and its right border (the docs promise 80)."""
    from rich.console import Console
    from typer.testing import CliRunner

    import stack.cli.every_command as every_command
    import stack.manager.client as client
    from stack.cli.root import app

    detail = "engine pid 12345 on 127.0.0.1:41234, ready after 14.2 s"
    mgr = {"state": "ready", "tier": "cold", "detail": detail, "need_gib": 1.53, "in_flight": 0, "queued": 0,
           "idle_s": 12.0, "restarts": 0, "last_switch": {"kind": "cold", "seconds": 14.2}}  # fmt: skip
    stopped = {**mgr, "state": "stopped", "detail": "not started", "last_switch": None}
    body = {"models": [{"model": "smollm2-135m-instruct", "state": "ready", "manager": mgr},
                       {"model": "all-minilm-l6-v2", "state": "stopped", "manager": stopped}]}  # fmt: skip
    monkeypatch.setattr(client, "admin", lambda *a, **k: body)
    # The CLI's console reads COLUMNS when it is made (at import): one made under COLUMNS=80, as a terminal's.
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(every_command, "out", Console())
    result = CliRunner().invoke(app, ["models"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.rstrip("\n").splitlines()
    assert max(len(line) for line in lines) <= 80
    table = [line for line in lines if line[:1] in "┏┃┡│└"]
    assert all(line.endswith(("┓", "┃", "┩", "│", "┘")) for line in table), "\n".join(table)  # the right border
    assert "detail" in lines[2]
    shown = "".join(line.split("│")[-2] for line in table if line.startswith("│")).replace(" ", "")
    assert detail.replace(" ", "") in shown
