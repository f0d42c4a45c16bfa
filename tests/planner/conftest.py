"""Helpers for the planner's tests: real config.json files of known models, the built-in configuration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stack.config import StackConfig, load_config
from stack.planner.model_meta import ModelShape, parse_config

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "model_configs"
GIB = 1024**3


def config_of(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def shape_of(name: str) -> ModelShape:
    return parse_config(config_of(name), name)


@pytest.fixture(scope="session")
def cfg() -> StackConfig:
    return load_config()


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    # The planner falls back to its built-in copies of known configs; never wait on a network here.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
