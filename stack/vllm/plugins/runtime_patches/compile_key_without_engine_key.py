"""Keep the engine's API key out of vLLM's torch.compile cache key (vLLM before 0.31).

The stack gives every engine a fresh credential per start (adr/0020), in VLLM_API_KEY. vLLM 0.26's
`envs.compile_factors()` hashes every known VLLM_* variable it does not list as ignored, and VLLM_API_KEY is not
listed until 0.31: each start's new key made a new cache key, so a repeat `vstack up` compiled the model again
(measured on an H100, 2026-11-26: 86.0 s against plain `vllm serve`'s 44.8 s, which loaded its AOT-compiled
model). The same function's result is also written raw to the engine log at DEBUG level, key included.

Dropping the one entry from the factors keeps both the backbone cache directory and the AOT key stable across
starts, and the credential out of the DEBUG log. Callers reach the function as `envs.compile_factors()` (module
attribute), so replacing it on the module is enough. Where vLLM already ignores the key, nothing is changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MARK = "_vstack_patch"
KEY_ENV = "VLLM_API_KEY"


def without_engine_key(original: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    def compile_factors() -> dict[str, Any]:
        factors = dict(original())
        factors.pop(KEY_ENV, None)  # a credential, not a property of the compiled graph
        return factors

    setattr(compile_factors, MARK, "compile-key-without-engine-key")
    compile_factors.__wrapped__ = original  # type: ignore[attr-defined]
    return compile_factors


def apply() -> bool:
    import vllm.envs as envs

    original = getattr(envs, "compile_factors", None)
    if original is None or getattr(original, MARK, None):
        return False  # a vLLM without the function, or ours already (loaded twice in this process)
    if KEY_ENV not in original():
        return False  # upstream ignores it (0.31 and later)
    envs.compile_factors = without_engine_key(original)
    return True
