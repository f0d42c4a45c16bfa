"""Loading: built-in files, the user's file, extends, precedence (file < env < CLI), and what we ship."""

from __future__ import annotations

from pathlib import Path

import pytest

from stack.config import load_config, resolve_profile
from stack.config.loader import builtin_config_dir
from stack.errors import ConfigError
from tests.conftest import REPO, write


def test_builtin_configs_load_and_every_profile_resolves() -> None:
    cfg = load_config()
    assert {"rtx4090", "a100-40gb", "a100-80gb", "h100-80gb", "h200", "l4", "cpu"} <= set(cfg.hardware)
    assert {"smollm2-135m-instruct", "qwen2.5-7b-instruct", "llama-3.1-8b-instruct",
            "qwen2.5-32b-instruct-awq", "llama-3.3-70b-instruct"} <= set(cfg.models)
    assert cfg.default_model == "smollm2-135m-instruct"
    for name in cfg.profiles:
        resolved = resolve_profile(cfg, name, "cpu")
        assert resolved.model.name in cfg.models


def test_builtin_dir_is_the_checkouts_configs() -> None:
    assert builtin_config_dir() == REPO / "configs"


def test_rtx4090_and_8xa100_defaults_are_the_documented_ones() -> None:
    cfg = load_config()
    assert cfg.hardware["rtx4090"].engine["gpu_memory_utilization"] == 0.85
    assert cfg.hardware["rtx4090"].memory_gib == 24
    x8 = cfg.hardware["a100-80gb-x8"]
    assert x8.gpu_count == 8
    assert x8.engine["tensor_parallel_size"] == 8
    assert x8.engine["max_num_batched_tokens"] == 16384
    assert x8.engine["max_num_seqs"] == 256
    # inherited from a100-80gb through `extends:`
    assert x8.memory_gib == 80 and x8.engine["gpu_memory_utilization"] == 0.90


def test_extends_merges_engine_options_and_child_wins(config_dir: Path) -> None:
    write(config_dir, "profiles/child.yaml",
          "name: child\nextends: gpu24-big\nengine:\n  max_num_seqs: 4\n  max_model_len: null\n")
    cfg = load_config(builtin_dir=config_dir)
    child = cfg.profiles["child"]
    assert child.hardware == "gpu24" and child.model == "big"
    assert child.engine == {"max_model_len": None, "max_num_seqs": 4}
    resolved = resolve_profile(cfg, "child", "cpu")
    # hardware < model < profile; `null` unsets what a lower layer set
    assert resolved.engine["max_num_seqs"] == 4
    assert "max_model_len" not in resolved.engine
    assert resolved.engine["gpu_memory_utilization"] == 0.85


def test_extends_cycle_is_reported(config_dir: Path) -> None:
    write(config_dir, "profiles/a.yaml", "name: a\nextends: b\n")
    write(config_dir, "profiles/b.yaml", "name: b\nextends: a\n")
    with pytest.raises(ConfigError, match=r"cycle .*a -> b -> a|cycle .*b -> a -> b"):
        load_config(builtin_dir=config_dir)


def test_extends_unknown_parent_suggests(config_dir: Path) -> None:
    write(config_dir, "profiles/x.yaml", "name: x\nextends: gpu24-bigg\n")
    with pytest.raises(ConfigError) as exc:
        load_config(builtin_dir=config_dir)
    text = str(exc.value)
    assert "profiles/x.yaml" in text and "profiles.x.extends" in text and "did you mean 'gpu24-big'" in text


def test_user_file_overrides_builtin_entry_key_by_key(config_dir: Path, tmp_path: Path) -> None:
    user = write(tmp_path, "mine.yaml", "port: 9000\nmodels:\n  tiny:\n    engine:\n      max_model_len: 1024\n")
    cfg = load_config(user, builtin_dir=config_dir)
    assert cfg.port == 9000
    assert cfg.models["tiny"].engine["max_model_len"] == 1024
    assert cfg.models["tiny"].source.hub == "org/tiny"  # the rest of the built-in entry stays


def test_user_config_from_env_variable(config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = write(tmp_path, "mine.yaml", "port: 9100\n")
    monkeypatch.setenv("VSTACK_CONFIG", str(user))
    assert load_config(builtin_dir=config_dir).port == 9100


def test_user_config_folder_adds_profiles(config_dir: Path, tmp_path: Path) -> None:
    write(tmp_path / "mine", "profiles/cpu-tiny.yaml", "name: cpu-tiny\nhardware: cpu\nmodel: tiny\n")
    cfg = load_config(tmp_path / "mine", builtin_dir=config_dir)
    assert "cpu-tiny" in cfg.profiles


def test_precedence_yaml_below_env(config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = write(tmp_path, "mine.yaml", "port: 9000\n")
    monkeypatch.setenv("VSTACK_PORT", "9001")
    assert load_config(user, builtin_dir=config_dir).port == 9001


def test_precedence_env_below_cli(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VSTACK_PORT", "9001")
    assert load_config(builtin_dir=config_dir, overrides={"port": 9002}).port == 9002


def test_env_nested_delimiter_reaches_engine_options(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VSTACK_ENGINE__MAX_MODEL_LEN", "1024")
    monkeypatch.setenv("VSTACK_ENGINE__ENFORCE_EAGER", "true")
    cfg = load_config(builtin_dir=config_dir)
    resolved = resolve_profile(cfg, "auto", "cpu")
    assert resolved.engine["max_model_len"] == 1024  # env beats model's 2048
    assert resolved.engine["enforce_eager"] is True
    assert "VSTACK_ENGINE__MAX_MODEL_LEN" in resolved.engine_origins["max_model_len"]


def test_env_json_for_nested_models(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VSTACK_MODELS__TINY__SAMPLING__TEMPERATURE", "0.9")
    cfg = load_config(builtin_dir=config_dir)
    assert cfg.models["tiny"].sampling.temperature == 0.9


def test_auto_uses_the_profile_written_for_that_hardware_and_model() -> None:
    cfg = load_config()
    resolved = resolve_profile(cfg, "auto", "cpu")
    assert resolved.name == "cpu-smollm2"
    assert resolved.engine["max_model_len"] == 4096  # the profile's, over the model's 8192


def test_model_name_is_served_on_detected_hardware(config_dir: Path) -> None:
    cfg = load_config(builtin_dir=config_dir)
    resolved = resolve_profile(cfg, "tiny", "gpu24")
    assert resolved.name == "gpu24/tiny"
    assert resolved.engine == {"override_generation_config": {"temperature": 0.5},
                               "gpu_memory_utilization": 0.85, "max_num_seqs": 64, "max_model_len": 2048}


def test_model_with_a_profile_for_the_hardware_uses_it(config_dir: Path) -> None:
    cfg = load_config(builtin_dir=config_dir)
    assert resolve_profile(cfg, "big", "gpu24").name == "gpu24-big"
    assert resolve_profile(cfg, "big", "cpu").name == "cpu/big"


def test_sampling_defaults_become_override_generation_config(config_dir: Path) -> None:
    cfg = load_config(builtin_dir=config_dir)
    resolved = resolve_profile(cfg, "tiny", "cpu")
    assert resolved.engine["override_generation_config"] == {"temperature": 0.5}


def test_dash_and_underscore_engine_keys_are_the_same(config_dir: Path) -> None:
    cfg = load_config(builtin_dir=config_dir, text="engine:\n  max-num-seqs: 3\n")
    assert cfg.engine == {"max_num_seqs": 3}


def test_origins_name_the_file_of_each_engine_option() -> None:
    resolved = resolve_profile(load_config(), "rtx4090-qwen2.5-7b", "cpu")
    assert resolved.engine_origins["gpu_memory_utilization"].startswith("configs/hardware/rtx4090.yaml")
    assert resolved.engine_origins["max_model_len"].startswith("configs/profiles/rtx4090-qwen2.5-7b.yaml")
