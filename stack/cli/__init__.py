"""The `vstack` command line (stack.cli.root assembles it).

Nothing is imported here until `app` or `main` is asked for: the gateway process `vstack up` starts
(stack.cli.gateway_process) lives in this package, and importing the whole Typer CLI first delayed every
start by ~0.15 s (issue 37).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["app", "main"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'stack.cli' has no attribute {name!r}")
    root = importlib.import_module("stack.cli.root")
    globals().update(app=root.app, main=root.main)
    return globals()[name]
