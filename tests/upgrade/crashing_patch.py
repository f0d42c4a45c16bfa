"""A runtime patch that raises when loaded: the upgrade gate must fail a candidate whose ledger holds it
(tests/upgrade/test_patch_load_gate.py). Loaded only through a test ledger, never shipped."""

from __future__ import annotations


def apply() -> bool:
    raise RuntimeError("test patch: the hooked vLLM function is gone")
