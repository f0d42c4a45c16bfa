"""vLLM's own caches apart for each candidate vLLM that `vstack upgrade` builds (issue 37: caches keyed by
vLLM version).

vLLM keeps what it learns about a model class (`modelinfos/`, the inspection it runs in a child process: ~10 s
on a small CPU, 2026-11-27) and its compiled graphs under VLLM_CACHE_ROOT (default ~/.cache/vllm), one file per
model class checked by a hash of vLLM's own source. Two vLLM versions sharing the root overwrite each other's
files: while `vstack upgrade check` or a rollout alternates the pinned vLLM and a candidate, every start of
either inspects the model again. An engine run by a candidate venv's Python (under
CACHE_DIR/upgrade/venvs/<dist>-<version>) gets its own root inside that venv: keyed by version by construction,
gone with the venv. The pinned vLLM keeps the default root; a VLLM_CACHE_ROOT the user set is left alone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

CACHE_ENV = "VLLM_CACHE_ROOT"


def candidate_venvs(cache_dir: str | Path) -> Path:
    """Where `vstack upgrade` builds its candidate venvs (stack.upgrade.venv)."""
    return Path(cache_dir) / "upgrade" / "venvs"


def candidate_cache_root(python: str, cache_dir: str | Path, env: Mapping[str, str]) -> str | None:
    """VLLM_CACHE_ROOT for an engine run by `python`: its candidate venv's own (VENV/vllm-cache) if `python` is
    a candidate venv's; None for any other Python or where `env` (the engine's, over ours) sets one."""
    if env.get(CACHE_ENV):
        return None
    path, venvs = absolute(python), absolute(candidate_venvs(cache_dir))
    if path.parent.name != "bin" or path.parent.parent.parent != venvs:
        return None
    return str(path.parent.parent / "vllm-cache")


def absolute(p: str | Path) -> Path:
    """A Python's or a folder's path as the stack compares them: `~` expanded, made absolute, not resolved (a
    venv's python is a link to the interpreter it was made by)."""
    return Path(os.path.abspath(Path(p).expanduser()))
