"""Decisions for unset fields, each with its reason, and every refusal with its numbers."""

from __future__ import annotations

import pytest

from stack.config import resolve_profile
from stack.config.resolve import ResolvedProfile
from stack.config.schema import ModelEntry, ModelSource, StackConfig
from stack.hardware import GpuInfo, HardwareInfo
from stack.planner.decisions import Request
from stack.planner.errors import FitError
from stack.planner.fit_planner import fit_model, fit_profile, quantized_variants

from .conftest import GIB


def test_refuses_32b_bf16_on_a_4090_and_names_the_way_out(cfg: StackConfig) -> None:
    with pytest.raises(FitError) as err:
        fit_model(cfg, "Qwen/Qwen2.5-32B-Instruct", "rtx4090")
    assert err.value.message == (
        "weights need 61.0 GiB; an RTX 4090 has 24 GiB: use qwen2.5-32b-instruct-awq, 4 GPUs (max_model_len 32768) "
        "or 8 GPUs (max_model_len 32768)"
    )
    assert err.value.exit_code == 6


def test_refuses_70b_on_one_h200_and_offers_fp8_on_load(cfg: StackConfig) -> None:
    with pytest.raises(
        FitError,
        match=r"weights need 131.4 GiB; an H200 has 141 GiB: use 2 GPUs \(max_model_len "
        r"32768\), 4 GPUs .* or quantization fp8",
    ):
        fit_model(cfg, "llama-3.3-70b-instruct", "h200")


def test_a_70b_on_one_a100_lists_every_gpu_count_that_fits_with_its_context_and_why(cfg: StackConfig) -> None:
    """Issue 50: it said only "use 4 GPUs" while 2 fit at max_model_len 25600, and "131.4 GiB of weights per
    GPU" for the model on one GPU."""
    with pytest.raises(FitError) as err:
        fit_model(cfg, "llama-3.3-70b-instruct", "a100-80gb")
    assert err.value.message == (
        "weights need 131.4 GiB; an A100 has 80 GiB: use 2 GPUs (max_model_len 25600), "
        "4 GPUs (max_model_len 32768) or 8 GPUs (max_model_len 32768)"
    )
    hint = err.value.hint or ""
    assert hint.startswith("llama-3.3-70b-instruct needs 131.4 GiB of weights on one GPU plus about 2.3 GiB")
    assert "per GPU over" not in hint and "131.4 GiB of weights per GPU" not in hint
    lines = hint.splitlines()[1:]
    assert lines == [
        "  2 GPUs: max_model_len 25600 (65.7 GiB of weights per GPU leaves 4.0 GiB of KV cache per GPU: short of "
        "the 32768 asked for)",
        "  4 GPUs: max_model_len 32768 (32.9 GiB of weights per GPU leaves 37.3 GiB of KV cache per GPU: holds the "
        "32768 asked for)",
        "  8 GPUs: max_model_len 32768 (16.4 GiB of weights per GPU leaves 54.0 GiB of KV cache per GPU: holds the "
        "32768 asked for)",
    ]


def test_context_longer_than_the_model(cfg: StackConfig) -> None:
    with pytest.raises(FitError, match="has a context of 32768 tokens; 65536 was asked for"):
        fit_model(cfg, "Qwen/Qwen2.5-7B-Instruct", "h100-80gb", Request(context=65536))


def test_context_that_does_not_fit_gives_the_longest_that_does(cfg: StackConfig) -> None:
    with pytest.raises(FitError) as err:
        fit_model(
            cfg,
            "meta-llama/Llama-3.1-8B-Instruct",
            "rtx4090",
            Request(context=131072),
            engine={"kv_cache_dtype": "auto"},
        )
    assert err.value.message.startswith(
        "a 131072-token context needs 16.0 GiB of KV cache; after the weights (15.0 GiB)"
    )
    assert "max_model_len" in (err.value.hint or "") and "gpu_memory_utilization 0.92" in (err.value.hint or "")


def test_concurrency_is_part_of_the_refusal(cfg: StackConfig) -> None:
    with pytest.raises(FitError, match="4 requests of 32768 tokens need"):
        fit_model(cfg, "meta-llama/Llama-3.1-8B-Instruct", "rtx4090", Request(context=32768, concurrency=4))


def test_utilization_above_what_is_free(cfg: StackConfig) -> None:
    with pytest.raises(
        FitError,
        match=r"gpu_memory_utilization 0.97 asks vLLM for 22.9 GiB per GPU, but only "
        r"22.1 GiB is free once the CUDA context and desktop take 1.5 GiB",
    ):
        fit_model(cfg, "qwen2.5-7b-instruct", "rtx4090", engine={"gpu_memory_utilization": 0.97})


def test_cpu_refuses_when_ram_is_short(cfg: StackConfig) -> None:
    info = HardwareInfo(gpus=[], cpu_count=2, ram_total=8 * GIB, ram_available=int(3 * GIB))
    with pytest.raises(FitError, match=r"weights need 15.0 GiB.*3.0 GiB of RAM is free"):
        fit_model(cfg, "meta-llama/Llama-3.1-8B-Instruct", "cpu", hardware_info=info)


def test_fp8_kv_cache_only_when_only_it_reaches_the_context(cfg: StackConfig) -> None:
    plan = fit_model(cfg, "meta-llama/Llama-3.1-8B-Instruct", "rtx4090", Request(context=40960))
    assert plan.engine_updates["kv_cache_dtype"] == "fp8"
    assert plan.engine_updates["max_model_len"] == 40960
    assert "only an fp8 KV cache holds" in next(d.reason for d in plan.decisions if d.key == "kv_cache_dtype")
    short = fit_model(cfg, "meta-llama/Llama-3.1-8B-Instruct", "rtx4090", Request(context=16384))
    assert "kv_cache_dtype" not in short.engine_updates


def test_smallest_tensor_parallel_size_that_fits(cfg: StackConfig) -> None:
    plan = fit_model(cfg, "llama-3.3-70b-instruct", "a100-80gb", Request(gpus=8))
    tp = plan.engine_updates["tensor_parallel_size"]
    assert tp in (2, 4) and plan.budget.kv > 0
    with pytest.raises(FitError):  # one fewer power of two does not hold the profile's 32768 context
        fit_model(cfg, "llama-3.3-70b-instruct", "a100-80gb", Request(gpus=tp // 2))
    assert "smallest that fits" in next(d.reason for d in plan.decisions if d.key == "tensor_parallel_size")


def test_max_model_len_is_the_largest_that_fits(cfg: StackConfig) -> None:
    plan = fit_model(cfg, "meta-llama/Llama-3.1-8B-Instruct", "rtx4090")
    length = plan.engine_updates["max_model_len"]
    assert length % 1024 == 0 and 1024 <= length < 131072
    assert plan.kv.bytes_per_request(length, 2048) <= plan.budget.kv
    assert plan.kv.bytes_per_request(length + 1024, 2048) > plan.budget.kv
    assert "does not fit" in next(d.reason for d in plan.decisions if d.key == "max_model_len")


def test_profile_values_are_kept_and_not_updated(cfg: StackConfig) -> None:
    resolved = resolve_profile(cfg, "rtx4090-qwen2.5-7b", "rtx4090")
    plan = fit_profile(resolved, cfg=cfg)
    assert "max_model_len" not in plan.engine_updates  # the profile set it
    kept = {d.key: d for d in plan.decisions if d.source == "profile"}
    assert kept["max_model_len"].value == 16384 and "profiles.rtx4090-qwen2.5-7b" in kept["max_model_len"].origin
    assert plan.engine_updates == {"tensor_parallel_size": 1}


def test_the_gpu_share_left_to_vllm_is_the_engines_own_default(cfg: StackConfig) -> None:
    """The engine's option catalogue says vLLM's default gpu_memory_utilization (`vstack up` reads it from the
    engine's Python); without one, the vLLM beside the CLI says it (0.92 in 0.26-0.33): no number of ours."""

    def left_to_vllm() -> ResolvedProfile:  # the hardware profiles all set it: this one leaves it to vLLM
        resolved = resolve_profile(cfg, "llama-3.1-8b-instruct", "h100-80gb")
        resolved.engine.pop("gpu_memory_utilization")
        return resolved

    plan = fit_profile(left_to_vllm(), cfg=cfg)
    planned = {d.key: d for d in plan.decisions}["gpu_memory_utilization"]
    assert (planned.value, planned.source) == (0.92, "vllm") and planned.reason.startswith("vLLM's default: ")
    other = fit_profile(left_to_vllm(), cfg=cfg, vllm_defaults={"gpu_memory_utilization": 0.8})
    decided = {d.key: d for d in other.decisions}["gpu_memory_utilization"]
    assert decided.value == 0.8 and "gpu_memory_utilization" not in other.engine_updates  # vLLM applies its own
    assert other.budget.requested < plan.budget.requested


def test_plan_profile_with_detected_hardware(cfg: StackConfig) -> None:
    info = HardwareInfo(
        gpus=[GpuInfo(0, "NVIDIA H100 80GB HBM3", int(79.2 * GIB), int(78.6 * GIB), "9.0")],
        cpu_count=16,
        ram_total=128 * GIB,
        ram_available=120 * GIB,
    )
    resolved = resolve_profile(cfg, "llama-3.1-8b-instruct", "h100-80gb")
    plan = fit_profile(resolved, info, cfg=cfg)
    assert plan.kv_tokens > 400_000 and plan.max_model_len == 32768
    assert any(line.startswith("max_model_len=32768 (profile") for line in plan.log_lines())


def test_cpu_plan_sets_the_kv_space_from_free_ram(cfg: StackConfig) -> None:
    info = HardwareInfo(gpus=[], cpu_count=2, ram_total=24 * GIB, ram_available=20 * GIB)
    plan = fit_model(cfg, "smollm2-135m-instruct", "cpu", hardware_info=info)
    assert plan.env_updates == {"VLLM_CPU_KVCACHE_SPACE": "5"}  # 25% of 20 GiB
    # the CPU profile runs float32 (hardware cpu: dtype), so the cache holds 4-byte elements
    assert plan.kv_tokens == 5 * GIB // (30 * 2 * 3 * 64 * 4 * 128) * 128


def test_cpu_plan_respects_a_set_kv_space(cfg: StackConfig, tmp_path) -> None:
    resolved = ResolvedProfile(
        "t",
        "",
        cfg.hardware["cpu"],
        ModelEntry(name="smol", source=ModelSource(hub="HuggingFaceTB/SmolLM2-135M-Instruct")),
        {"max_model_len": 2048},
        {},
        {"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    plan = fit_profile(resolved)
    assert plan.env_updates == {} and plan.budget.kv == GIB


def test_every_builtin_profile_is_planned(cfg: StackConfig) -> None:
    outcomes = {}
    for name, profile in cfg.profiles.items():
        try:
            outcomes[name] = fit_profile(resolve_profile(cfg, name, profile.hardware), cfg=cfg).max_model_len
        except FitError as exc:
            outcomes[name] = exc.message
    assert outcomes["rtx4090-qwen2.5-7b"] == 16384
    assert outcomes["h200-llama-3.3-70b-fp8"] == 32768
    assert outcomes["a100x8-llama-3.3-70b"] == 32768


def test_quantized_variants(cfg: StackConfig) -> None:
    assert quantized_variants(cfg, "Qwen/Qwen2.5-32B-Instruct") == ["qwen2.5-32b-instruct-awq"]
    assert quantized_variants(cfg, "Qwen/Qwen2.5-7B-Instruct") == []
