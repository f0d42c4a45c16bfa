"""CPU attention: refuse an FP8 KV cache up front on CPUs without AVX-512 or AMX (backport from 0.33.0).

In 0.32 `CPUAttentionBackend` inherits the generic `supports_kv_cache_dtype`, which only checks the
dtype list, so `--kv-cache-dtype fp8` passes backend validation on an AVX2-only CPU and the engine
dies later in `_get_attn_isa` ("fp8 KV cache requires AVX512 or AMX"), after loading the model.
0.33.0 adds this classmethod, mirroring the ISA check. A class attribute reaches every caller, which
is why this one can be a runtime patch rather than a source diff.
"""

from __future__ import annotations

from typing import Any

MARK = "_vstack_patch"


def _supports_kv_cache_dtype(cls: Any, kv_cache_dtype: str | None) -> bool:
    import torch

    if kv_cache_dtype in (None, "auto", "bfloat16", "float16"):
        return True
    if kv_cache_dtype not in cls.supported_kv_cache_dtypes:
        return False
    return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_supported())


setattr(_supports_kv_cache_dtype, MARK, "cpu-fp8-kv-isa-check")


def apply() -> bool:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    current = CPUAttentionBackend.__dict__.get("supports_kv_cache_dtype")
    if current is not None:
        # Either ours already (loaded twice in this process) or upstream has its own: leave it.
        return False
    CPUAttentionBackend.supports_kv_cache_dtype = classmethod(_supports_kv_cache_dtype)  # type: ignore[method-assign,assignment]
    return True
