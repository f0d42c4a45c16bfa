"""The environment of a child process run in the engine's Python (`engine_python`), which may not have the
stack installed: our package goes first on its path, the caller's entries kept after it (a GPU site's
packages may only be reachable through them)."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


def engine_python_env(**extra: str) -> dict[str, str]:
    """This process's env plus `extra`, with the stack's package root first on PYTHONPATH."""
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    return env
