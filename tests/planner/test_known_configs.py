"""The config.json copies shipped for offline planning are the test fixtures, byte for byte."""

from __future__ import annotations

from stack.planner.sources import KNOWN_CONFIGS

from .conftest import FIXTURES


def test_known_configs_equal_fixtures() -> None:
    shipped = sorted(p.name for p in KNOWN_CONFIGS.glob("*.json"))
    assert shipped == sorted(p.name for p in FIXTURES.glob("*.json"))
    for name in shipped:
        assert (KNOWN_CONFIGS / name).read_bytes() == (FIXTURES / name).read_bytes()
