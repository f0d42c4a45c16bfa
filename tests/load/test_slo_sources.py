"""Where the SLO comes from: --slo > the scenario's `slo:` > the profile's `slo:` (checked with the config)."""

from __future__ import annotations

import pytest

from stack.config import load_config
from stack.errors import ConfigError
from stack.load.load_test import choose_slo
from stack.load.scenario import parse_scenario

PROFILE = """
profiles:
  cpu-fast:
    hardware: cpu
    model: smollm2-135m-instruct
    slo: ["p95_e2e_ms<800", "output_tokens_per_s>=50"]
"""


def test_precedence() -> None:
    cfg = load_config(text=PROFILE)
    bare = parse_scenario({"name": "bare"}, "bare.yaml")
    with_slo = parse_scenario({"name": "s", "slo": "p99_itl_ms<50"}, "s.yaml")
    clauses, source = choose_slo(None, bare, cfg, "cpu-fast")
    assert [str(c) for c in clauses] == ["p95_e2e_ms<800", "output_tokens_per_s>=50"]
    assert source.startswith("profile cpu-fast: slo")
    assert choose_slo(None, with_slo, cfg, "cpu-fast")[1] == "s.yaml: slo"
    assert choose_slo("error_rate<0.1", with_slo, cfg, "cpu-fast")[1] == "--slo"
    assert choose_slo(None, bare, cfg, None) == ([], "none given")


def test_a_bad_profile_slo_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(text=PROFILE.replace("p95_e2e_ms<800", "p95_e2e<800"))
    assert "profiles.cpu-fast.slo" in info.value.message and "p95_e2e_ms" in info.value.message
