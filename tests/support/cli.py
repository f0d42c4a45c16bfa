"""The `vstack` fixture: the real CLI (bench.harness.stack_cli) with its own state folder, the gateway on a
free port."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.stack_cli import Vstack, alive, family

__all__ = ["Vstack", "alive", "family", "vstack"]


@pytest.fixture
def vstack(tmp_path: Path) -> Vstack:
    # The gateway on a free port (the engine always takes a free loopback port behind it). Eager engines: a cold
    # torch.compile costs minutes on 2 cores; the docs' quick start and Compose keep the compiled start (adr/0038).
    env = {"VSTACK_PORT": "0", "VSTACK_GATEWAY__PORT": "0", "VSTACK_GATEWAY__HOST": "127.0.0.1",
           "VSTACK_ENGINE__ENFORCE_EAGER": "true"}
    return Vstack(tmp_path / "state", env)
