"""The gateway: section: defaults, validation messages, secrets kept out, keys hashed."""

from __future__ import annotations

import hashlib

import pytest

from stack.config import load_config
from stack.config.sections.gateway import GatewayConfig, KeyRef
from stack.errors import ConfigError
from stack.gateway.http.auth import KeyRing, hash_key


def test_shipped_config_has_a_gateway_on_port_8000() -> None:
    cfg = load_config()
    assert cfg.gateway.port == 8000
    assert cfg.gateway.cors_origins == []  # CORS off by default


def test_env_overrides_nested_gateway_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VSTACK_GATEWAY__PORT", "9123")
    assert load_config().gateway.port == 9123


def test_unknown_key_names_the_path_and_suggests() -> None:
    with pytest.raises(ConfigError, match=r"gateway\.prot: unknown key; did you mean 'port'"):
        load_config(text="gateway: {prot: 1}")


def test_provider_key_in_a_config_is_refused_without_echoing_it() -> None:
    text = "gateway: {cloud: [{model_name: x, litellm_params: {model: openai/x, api_key: sk-verysecret1}}]}"
    with pytest.raises(ConfigError) as err:
        load_config(text=text)
    assert "api_key_env" in str(err.value)
    assert "verysecret" not in str(err.value)


def test_keyref_needs_exactly_one_source() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        KeyRef(name="a")
    with pytest.raises(ValueError, match="64 hex"):
        KeyRef(name="a", sha256="not-a-hash")


def test_alias_cycle_is_refused() -> None:
    with pytest.raises(ValueError, match="cycle"):
        GatewayConfig(aliases={"a": "b", "b": "a"})


def test_keyring_from_hash_and_env() -> None:
    ring = KeyRing.from_refs(
        [KeyRef(name="team-a", sha256=hash_key("alpha")), KeyRef(name="ci", env="CI_KEY")], {"CI_KEY": "beta"}
    )
    assert ring.check("alpha") == "team-a"
    assert ring.check("beta") == "ci"
    assert ring.check("gamma") is None
    assert hash_key("alpha") == hashlib.sha256(b"alpha").hexdigest()


def test_missing_env_key_fails_unless_optional() -> None:
    with pytest.raises(ConfigError, match="CI_KEY is not set"):
        KeyRing.from_refs([KeyRef(name="ci", env="CI_KEY")], {})
    assert not KeyRing.from_refs([KeyRef(name="ci", env="CI_KEY", optional=True)], {}).enabled
