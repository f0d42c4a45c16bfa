"""The `vstack` command line (stack.cli.main assembles it)."""

from stack.cli.main import app, main

__all__ = ["app", "main"]
