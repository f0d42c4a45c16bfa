"""Every configuration error names the place (file or variable), the key path and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from stack.config import load_config, resolve_profile
from stack.errors import ConfigError
from tests.conftest import write


def _error(config_dir: Path, **kwargs) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(builtin_dir=config_dir, **kwargs)
    return str(exc.value)


def test_typo_in_a_key_gets_did_you_mean_with_file_and_path(config_dir: Path) -> None:
    write(config_dir, "models/tiny.yaml", "name: tiny\nsource: {hub: org/tiny}\nsampling:\n  temprature: 0.3\n")
    text = _error(config_dir)
    assert "configs/models/tiny.yaml" in text
    assert "models.tiny.sampling.temprature: unknown key; did you mean 'temperature'?" in text


def test_wrong_type_names_value_and_place(config_dir: Path) -> None:
    write(config_dir, "stack.yaml", "serve: auto\ndefault_model: tiny\nport: eighty\n")
    text = _error(config_dir)
    assert "configs/stack.yaml: port:" in text and "'eighty'" in text


def test_out_of_range_value(config_dir: Path) -> None:
    write(config_dir, "hardware/cpu.yaml", "name: cpu\naccelerator: cpu\ncpu_kv_cache: {fraction_of_free: 2}\n")
    text = _error(config_dir)
    assert "hardware.cpu.cpu_kv_cache.fraction_of_free" in text and "less than or equal to 0.9" in text


def test_missing_required_key(config_dir: Path) -> None:
    write(config_dir, "profiles/p.yaml", "name: p\nmodel: tiny\n")
    text = _error(config_dir)
    assert "configs/profiles/p.yaml: profiles.p.hardware: required key is missing" in text


def test_unknown_model_reference_suggests(config_dir: Path) -> None:
    write(config_dir, "profiles/p.yaml", "name: p\nhardware: cpu\nmodel: tinyy\n")
    text = _error(config_dir)
    assert "configs/profiles/p.yaml: profiles.p.model: unknown model 'tinyy'; did you mean 'tiny'?" in text


def test_unknown_default_model(config_dir: Path) -> None:
    text = _error(config_dir, text="default_model: huge\n")
    assert "<inline>: default_model: unknown model 'huge'" in text


def test_bad_value_from_environment_names_the_variable(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VSTACK_PORT", "not-a-port")
    text = _error(config_dir)
    assert "environment variable VSTACK_PORT: port:" in text


def test_misspelt_setting_in_environment_is_an_error(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VSTACK_STARTUP_TIMOUT_S", "5")
    text = _error(config_dir)
    assert "startup_timout_s" in text and "did you mean 'startup_timeout_s'" in text


def test_key_holding_variables_are_not_settings(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Configs name VSTACK_* variables that hold secrets (VSTACK_API_KEY); those are not misspelt settings.
    monkeypatch.setenv("VSTACK_API_KEY", "sk-local")
    monkeypatch.setenv("VSTACK_RUNTIME_PATCHES", "0")
    assert load_config(builtin_dir=config_dir).port == 0


def test_invalid_yaml_names_file_and_line(config_dir: Path) -> None:
    write(config_dir, "models/tiny.yaml", "name: tiny\nsource: {hub: org/tiny\n")
    text = _error(config_dir)
    assert "configs/models/tiny.yaml:" in text and "invalid YAML" in text


def test_config_path_that_does_not_exist(config_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file or folder"):
        load_config(tmp_path / "nope.yaml", builtin_dir=config_dir)


def test_gpu_profile_without_memory_is_rejected(config_dir: Path) -> None:
    write(config_dir, "hardware/g.yaml", "name: g\naccelerator: gpu\n")
    assert "a GPU profile needs memory_gib" in _error(config_dir)


def test_public_host_is_refused(config_dir: Path) -> None:
    text = _error(config_dir, text="host: 0.0.0.0\n")
    assert "would expose the engine" in text


def test_several_problems_are_reported_together(config_dir: Path) -> None:
    write(config_dir, "profiles/p.yaml", "name: p\nhardware: cpuu\nmodel: tinyy\n")
    text = _error(config_dir)
    assert "unknown hardware profile 'cpuu'" in text and "unknown model 'tinyy'" in text


def test_unknown_profile_to_serve_suggests(config_dir: Path) -> None:
    cfg = load_config(builtin_dir=config_dir)
    with pytest.raises(ConfigError, match="did you mean 'gpu24-big'"):
        resolve_profile(cfg, "gpu24-bog", "cpu")


def test_secret_values_are_not_echoed(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = _error(config_dir, text="hf_token: {nested: hf_supersecret}\n")
    assert "hf_supersecret" not in text and "hf_token" in text
