"""Which hardware profile applies to what was detected, and the CPU KV cache size."""

from __future__ import annotations

from stack.config import load_config
from stack.hardware import GIB, GpuInfo, HardwareInfo, detect, match_profile
from stack.vllm.cpu_rules import kv_cache_gib


def _gpus(name: str, count: int, mem_gib: float) -> HardwareInfo:
    gpus = [GpuInfo(i, name, int(mem_gib * GIB), int(mem_gib * GIB)) for i in range(count)]
    return HardwareInfo(gpus=gpus, cpu_count=32, ram_total=256 * GIB, ram_available=200 * GIB)


def test_no_gpu_means_cpu() -> None:
    profile, why = match_profile(HardwareInfo(cpu_count=2, ram_total=24 * GIB, ram_available=20 * GIB), load_config())
    assert profile.name == "cpu" and "no NVIDIA GPU" in why


def test_rtx4090_by_nvml_name() -> None:
    profile, _ = match_profile(_gpus("NVIDIA GeForce RTX 4090", 1, 24), load_config())
    assert profile.name == "rtx4090"


def test_eight_a100_80gb_pick_the_8_gpu_profile() -> None:
    cfg = load_config()
    assert match_profile(_gpus("NVIDIA A100-SXM4-80GB", 8, 80), cfg)[0].name == "a100-80gb-x8"
    assert match_profile(_gpus("NVIDIA A100-SXM4-80GB", 1, 80), cfg)[0].name == "a100-80gb"
    assert match_profile(_gpus("NVIDIA A100-SXM4-40GB", 1, 40), cfg)[0].name == "a100-40gb"


def test_h100_h200_l4() -> None:
    cfg = load_config()
    assert match_profile(_gpus("NVIDIA H100 80GB HBM3", 1, 80), cfg)[0].name == "h100-80gb"
    assert match_profile(_gpus("NVIDIA H200", 1, 141), cfg)[0].name == "h200"
    assert match_profile(_gpus("NVIDIA L4", 1, 24), cfg)[0].name == "l4"


def test_unknown_gpu_gets_the_largest_profile_that_fits_its_memory() -> None:
    profile, why = match_profile(_gpus("NVIDIA RTX A6000", 1, 48), load_config())
    assert profile.name == "a100-40gb" and "matches no profile" in why


def test_cpu_kv_cache_follows_free_memory_within_bounds() -> None:
    cpu = load_config().hardware["cpu"]
    rule = cpu.cpu_kv_cache
    assert rule is not None
    small, big, mid = 2 * GIB, 400 * GIB, 20 * GIB  # RAM available
    assert kv_cache_gib(small, rule) == max(1, int(rule.min_gib))
    assert kv_cache_gib(big, rule) == int(rule.max_gib)
    assert kv_cache_gib(mid, rule) == int(20 * rule.fraction_of_free)
    # never near vLLM's default of 92% of all RAM (24 GiB)
    assert kv_cache_gib(mid, rule) < 0.5 * 24


def test_detect_on_this_machine_reports_memory() -> None:
    info = detect()
    assert info.ram_total > 0 and info.cpu_count >= 1
    assert info.accelerator in ("cpu", "gpu")


def test_force_cpu(monkeypatch) -> None:
    monkeypatch.setenv("VSTACK_FORCE_CPU", "1")
    info = detect()
    assert info.gpus == [] and info.nvml_error == "VSTACK_FORCE_CPU=1"
