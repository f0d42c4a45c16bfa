"""Shared fixtures: a minimal built-in config folder, and the vLLM option dumps of three versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from stack.vllm.options import VllmCatalog

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent
VERSIONS = ("0.26", "0.32", "0.33")


@pytest.fixture(params=VERSIONS)
def catalog(request: pytest.FixtureRequest) -> VllmCatalog:
    """Every serve option of vLLM 0.26, 0.32 and 0.33 (dumped from the real packages)."""
    return VllmCatalog.load(FIXTURES / "vllm-args" / f"engine_args_{request.param}.json")


def load_catalog(version: str) -> VllmCatalog:
    return VllmCatalog.load(FIXTURES / "vllm-args" / f"engine_args_{version}.json")


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    """A small built-in configs/ folder: one CPU and one GPU hardware profile, two models, one profile."""
    root = tmp_path / "configs"
    write(root, "stack.yaml", "serve: auto\ndefault_model: tiny\n")
    write(root, "hardware/cpu.yaml", "name: cpu\naccelerator: cpu\nengine:\n  max_num_seqs: 8\n")
    write(root, "hardware/gpu24.yaml",
          "name: gpu24\naccelerator: gpu\nmatch: ['RTX 4090']\nmemory_gib: 24\nengine:\n"
          "  gpu_memory_utilization: 0.85\n  max_num_seqs: 64\n")
    write(root, "models/tiny.yaml",
          "name: tiny\nsource: {hub: org/tiny}\nsampling: {temperature: 0.5}\nengine:\n  max_model_len: 2048\n")
    write(root, "models/big.yaml", "name: big\nsource: {hub: org/big}\nengine:\n  max_model_len: 32768\n")
    write(root, "profiles/gpu24-big.yaml",
          "name: gpu24-big\nhardware: gpu24\nmodel: big\nengine:\n  max_model_len: 16384\n")
    return root


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No VSTACK_* variable of the developer's shell leaks into a test."""
    import os

    for key in list(os.environ):
        if key.upper().startswith("VSTACK_"):
            monkeypatch.delenv(key)
