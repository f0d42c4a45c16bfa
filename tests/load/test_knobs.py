"""Candidates from the device, the model and the installed vLLM; the planner's pre-filter before any start."""

from __future__ import annotations

from stack.config import load_config
from stack.hardware import GIB, GpuInfo, HardwareInfo
from stack.planner.model_planner import plan_model
from stack.tune.candidates import Candidate
from stack.tune.knobs import NGRAM, Device, device_candidates, numerics_change
from stack.tune.run import prefilter
from tests.conftest import load_catalog


def _overrides(d: Device) -> list[dict]:
    return [c.overrides for c in device_candidates(d)[0]]


def test_hopper_gets_fp8_weights_first_and_every_knob_its_vllm_has() -> None:
    found, skipped = device_candidates(Device("gpu", True, load_catalog("0.26"), {}))
    got = [c.overrides for c in found]
    assert got[0] == {"quantization": "fp8"}  # what moved goodput most on an H100
    for knob in ({"kv_cache_dtype": "fp8"}, {"quantization": "fp8", "kv_cache_dtype": "fp8"},
                 {"max_num_batched_tokens": 16384}, {"max_num_batched_tokens": 2048}, {"max_num_seqs": 128},
                 {"speculative_config": NGRAM}, {"enable_prefix_caching": False},
                 {"max_cudagraph_capture_size": 1024, "max_num_seqs": 1024}):
        assert knob in got
    why = {s.label: s.reason for s in skipped}
    assert "default is auto" in why["async scheduling"]  # 0.26 turns it on by itself: not a candidate
    assert len({c.key for c in found}) == len(found)


def test_no_fp8_without_the_hardware_and_nothing_gpu_only_on_cpu() -> None:
    ampere = _overrides(Device("gpu", False, load_catalog("0.26"), {}))
    assert not any("fp8" in str(o) for o in ampere) and {"max_num_batched_tokens": 2048} in ampere
    found, skipped = device_candidates(Device("cpu", False, load_catalog("0.32"), {}))
    cpu = [c.overrides for c in found]
    assert {"max_num_seqs": 4} in cpu and not any("speculative_config" in o or "quantization" in o for o in cpu)
    assert {s.label: s.reason for s in skipped}["ngram speculative decoding"] == "GPU only"


def test_quantized_models_and_profile_settings() -> None:
    awq = _overrides(Device("gpu", True, load_catalog("0.26"), {}, model_quant="awq"))
    assert {"quantization": "awq_marlin"} in awq and {"quantization": "fp8"} not in awq
    _found, skipped = device_candidates(Device("gpu", True, load_catalog("0.26"), {"kv_cache_dtype": "fp8"},
                                              shared_prefix=True))
    reasons = {s.label: s.reason for s in skipped}
    assert "sets a KV dtype" in reasons["fp8 KV cache"] and "share a prefix" in reasons["no prefix caching"]


def test_an_option_this_vllm_lacks_is_skipped_by_name() -> None:
    catalog = load_catalog("0.26")
    del catalog.options["speculative_config"]
    _found, skipped = device_candidates(Device("gpu", True, catalog, {}))
    reasons = {s.label: s.reason for s in skipped}
    assert reasons["ngram speculative decoding"] == "vLLM 0.26.0 has no --speculative-config"


def test_numerics_changes_are_named() -> None:
    assert numerics_change({"quantization": "fp8", "kv_cache_dtype": "fp8"}) == "weights quantization fp8, KV cache fp8"
    assert numerics_change({"speculative_config": NGRAM}) == "speculative decoding"
    assert numerics_change({"max_num_seqs": 8, "kv_cache_dtype": "auto"}) is None
    assert numerics_change({"dtype": "bfloat16"}) == "dtype bfloat16" and numerics_change({"dtype": "auto"}) is None


def test_prefilter_drops_what_cannot_fit_before_anything_starts() -> None:
    cfg = load_config()
    rtx4090 = HardwareInfo(gpus=[GpuInfo(0, "NVIDIA GeForce RTX 4090", int(23.6 * GIB), int(23 * GIB), "8.9")],
                           cpu_count=16, ram_total=64 * GIB, ram_available=60 * GIB)
    catalog = load_catalog("0.26")
    base = plan_model(cfg, "llama-3.1-8b-instruct", rtx4090, catalog, port=0)
    long_context = Candidate({"max_model_len": 131072})
    cands = [Candidate({}), Candidate({"quantization": "fp8"}), long_context, Candidate({"max_num_seqs": 64})]
    plans, dropped = prefilter(cfg, "llama-3.1-8b-instruct", rtx4090, base, cands, catalog=catalog)
    assert set(plans) == {c.key for c in cands if c is not long_context}
    reason = dropped[long_context.key].error or ""
    assert reason.startswith("dropped before start:") and "KV cache" in reason and "RTX 4090" in reason
    assert plans[Candidate({"quantization": "fp8"}).key].engine["quantization"] == "fp8"
