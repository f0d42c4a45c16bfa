"""Any model by name (adr/0022): a Hub id or a folder that configs/models does not describe resolves to a
model entry made up for it (served as the Hub id / the folder's name), so `vstack up NAME` serves what
`vstack plan NAME` plans; `vstack plan PROFILE` plans the profile, never looking its name up on the Hub;
`vstack models add NAME` is the one command that makes NAME switchable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from stack.cli.switchable import add_switchable
from stack.config import load_config
from stack.config.resolve import resolve_profile
from stack.errors import ConfigError


def model_folder(root: Path, name: str = "My-Model") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return folder


def test_a_folder_resolves_to_a_model_served_by_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = model_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    resolved = resolve_profile(load_config(), "./My-Model", "cpu")
    assert resolved.ad_hoc and resolved.name == "cpu/my-model"
    assert resolved.model.source.path == str(folder) and resolved.served_name == "My-Model"
    assert resolved.hardware.name == "cpu" and "max_num_seqs" in resolved.engine  # the hardware's options


def test_a_hub_id_resolves_to_a_model_served_as_the_hub_id() -> None:
    resolved = resolve_profile(load_config(), "Qwen/Qwen2.5-0.5B-Instruct", "cpu")
    assert resolved.ad_hoc and resolved.served_name == "Qwen/Qwen2.5-0.5B-Instruct"
    assert resolved.model.source.hub == "Qwen/Qwen2.5-0.5B-Instruct" and resolved.model.name == "qwen2.5-0.5b-instruct"
    assert not resolve_profile(load_config(), "smollm2-135m-instruct", "cpu").ad_hoc


def test_neither_a_name_nor_a_hub_id_nor_a_folder_says_what_was_meant() -> None:
    with pytest.raises(ConfigError) as exc:
        resolve_profile(load_config(), "smollm2-135m-instrct", "cpu")
    assert "did you mean 'smollm2-135m-instruct'" in exc.value.message and "Hub id" in exc.value.hint


def test_serve_may_name_a_hub_id() -> None:
    assert load_config(text="serve: Qwen/Qwen2.5-0.5B-Instruct\n").serve == "Qwen/Qwen2.5-0.5B-Instruct"
    with pytest.raises(ConfigError):
        load_config(text="serve: not-a-model\n")


def test_plan_of_a_profile_plans_its_model_without_asking_the_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    import stack.planner.model_sources as sources
    from stack.planner.fit_planner import fit_model

    asked: list[str] = []
    real = sources._hub_config
    monkeypatch.setattr(sources, "_hub_config", lambda hub, *a, **k: asked.append(hub) or real(hub, *a, **k))
    cfg = load_config()
    plan = fit_model(cfg, "cpu-smollm2", "cpu")
    decided = {d.key: d for d in plan.decisions}
    assert decided["max_model_len"].value == 4096  # the profile's own setting, not the model's 8192
    assert decided["max_model_len"].origin == "profiles.cpu-smollm2.engine.max_model_len"
    with pytest.raises(ConfigError) as exc:
        fit_model(cfg, "cpu-smollm3", "cpu")
    assert "did you mean 'cpu-smollm2'" in exc.value.message
    assert "cpu-smollm2" not in asked and "cpu-smollm3" not in asked  # names are never Hub ids


def test_models_add_appends_to_the_users_file_and_keeps_its_comments(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("# my settings\ngateway:\n  port: 8123\n")
    cfg = load_config(path)
    _, models = add_switchable(cfg, "Qwen/Qwen2.5-0.5B-Instruct", path)
    assert models == ["Qwen/Qwen2.5-0.5B-Instruct"] and path.read_text().startswith("# my settings\n")
    again = load_config(path)
    assert again.manager.models == ["Qwen/Qwen2.5-0.5B-Instruct"] and again.gateway.port == 8123
    folder = model_folder(tmp_path)
    _, models = add_switchable(again, str(folder), path)
    assert models == ["Qwen/Qwen2.5-0.5B-Instruct", str(folder)]
    assert yaml.safe_load(path.read_text())["manager"]["models"] == models


def test_models_add_refuses_a_typo_and_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("gateway:\n  port: 8123\n")
    with pytest.raises(ConfigError) as exc:
        add_switchable(load_config(path), "qwen2.5-7b-instrut", path)
    assert "did you mean 'qwen2.5-7b-instruct'" in exc.value.message
    assert path.read_text() == "gateway:\n  port: 8123\n"
    with pytest.raises(ConfigError) as exc:
        add_switchable(load_config(), "qwen3-8b", None)
    assert "--config" in exc.value.hint
