"""The `vstack` fixture: the real CLI (bench.harness.stack_cli) with its own state folder, the gateway on a
free port."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.stack_cli import Vstack, alive, family

__all__ = ["Vstack", "alive", "family", "vstack"]


@pytest.fixture
def vstack(tmp_path: Path) -> Vstack:
    # The gateway on a free port (the engine always takes a free loopback port behind it).
    env = {"VSTACK_PORT": "0", "VSTACK_GATEWAY__PORT": "0", "VSTACK_GATEWAY__HOST": "127.0.0.1"}
    return Vstack(tmp_path / "state", env)
