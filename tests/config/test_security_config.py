"""Configurations that validate but weaken security are refused, naming the file and the key (issue 34, item 4).

Before: a second `gateway:` section silently replaced the first (and its api_keys); an admin key sharing a
client key's variable was accepted; an alias or adapter named like a model (or `default`) took its traffic.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stack.config import load_config
from stack.errors import ConfigError
from tests.conftest import write


def _error(config_dir: Path, user: Path) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(user, builtin_dir=config_dir)
    return str(exc.value)


def test_a_duplicated_top_level_section_is_refused_with_file_and_line(config_dir: Path, tmp_path: Path) -> None:
    user = write(tmp_path, "mine.yaml", "gateway:\n  api_keys:\n    - {env: TEAM_KEY}\nport: 0\n"
                                        "gateway:\n  port: 9000\n")  # fmt: skip
    text = _error(config_dir, user)
    assert "mine.yaml:5:1" in text and "duplicate key 'gateway' (first on line 1)" in text, text


def test_a_duplicated_nested_key_is_refused_too(config_dir: Path, tmp_path: Path) -> None:
    user = write(tmp_path, "mine.yaml", "gateway:\n  admin_key: {env: A}\n  port: 1\n  admin_key: {env: B}\n")
    assert "mine.yaml:4:3" in _error(config_dir, user)


def test_yaml_merge_keys_still_work(config_dir: Path, tmp_path: Path) -> None:
    user = write(tmp_path, "mine.yaml", "x-base: &base {max_num_seqs: 4}\nengine:\n  <<: *base\n  max_num_seqs: 8\n")
    with pytest.raises(ConfigError) as exc:  # x-base is no setting; the merge itself is no duplicate
        load_config(user, builtin_dir=config_dir)
    assert "duplicate" not in str(exc.value)


def test_the_admin_key_may_not_be_a_client_key(config_dir: Path, tmp_path: Path) -> None:
    user = write(tmp_path, "mine.yaml", "gateway:\n  api_keys: [{name: team, env: SHARED}]\n"
                                        "  admin_key: {name: admin, env: SHARED}\n")  # fmt: skip
    text = _error(config_dir, user)
    assert "mine.yaml" in text and "admin_key and api_keys.0 ('team') are the same key" in text, text


@pytest.mark.parametrize(("gateway", "said"), [
    ("aliases: {tiny: big}", "alias 'tiny' is a model's name"),
    ("aliases: {default: big}", "`default` is the gateway's own alias"),
])  # fmt: skip
def test_an_alias_may_not_shadow_a_model(config_dir: Path, tmp_path: Path, gateway: str, said: str) -> None:
    user = write(tmp_path, "mine.yaml", f"gateway:\n  {gateway}\n")
    text = _error(config_dir, user)
    assert "mine.yaml" in text and "gateway.aliases." in text and said in text, text


@pytest.mark.parametrize("name", ["big", "default", "fast"])
def test_an_adapter_may_not_shadow_a_model_or_alias(config_dir: Path, tmp_path: Path, name: str) -> None:
    user = write(tmp_path, "mine.yaml", "gateway:\n  aliases: {fast: big}\nmodels:\n  tiny:\n"
                                        f"    adapters: [{{name: {name}, path: /nowhere}}]\n")  # fmt: skip
    text = _error(config_dir, user)
    assert "models.tiny.adapters.0.name" in text and f"adapter {name!r} is named like a model or alias" in text, text
