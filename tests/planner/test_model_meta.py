"""config.json -> the facts that decide memory, checked against published figures."""

from __future__ import annotations

import pytest

from stack.planner.errors import ModelShapeError
from stack.planner.model_meta import parse_config
from stack.planner.weights import estimate_parameters, weights_from_config

from .conftest import GIB, config_of, shape_of

# Parameter counts published on the models' Hub pages (safetensors metadata).
PUBLISHED = {
    "meta-llama--Llama-3.1-8B-Instruct": 8_030_261_248,
    "meta-llama--Llama-3.3-70B-Instruct": 70_553_706_496,
    "Qwen--Qwen2.5-7B-Instruct": 7_615_616_512,
    "Qwen--Qwen2.5-32B-Instruct": 32_763_876_352,
    "mistralai--Mixtral-8x7B-Instruct-v0.1": 46_702_792_704,
    "deepseek-ai--DeepSeek-V2-Lite-Chat": 15_706_484_224,
    "google--gemma-2-9b-it": 9_241_705_984,
    "HuggingFaceTB--SmolLM2-135M-Instruct": 134_515_008,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_the_published_one(name: str) -> None:
    linear, other = estimate_parameters(shape_of(name))
    assert linear + other == pytest.approx(PUBLISHED[name], rel=1e-4)


def test_qwen3_moe_parameter_count() -> None:
    linear, other = estimate_parameters(shape_of("Qwen--Qwen3-30B-A3B"))
    assert (linear + other) / 1e9 == pytest.approx(30.5, abs=0.05)  # "30.5B" on its model card


@pytest.mark.parametrize(("name", "gib"), [
    ("Qwen--Qwen2.5-32B-Instruct", 61.03),  # bf16: the "61.0 GiB" of the refusal message
    ("Qwen--Qwen2.5-32B-Instruct-AWQ", 18.0),  # AWQ 4-bit: 19.3 GB on the Hub
    ("Qwen--Qwen2.5-7B-Instruct-GPTQ-Int4", 5.19),  # GPTQ 4-bit: 5.58 GB on the Hub
    ("RedHatAI--Meta-Llama-3.1-8B-Instruct-FP8", 8.46),  # fp8 linears, bf16 embeddings: 9.08 GB
    ("meta-llama--Llama-3.3-70B-Instruct", 131.42),
])
def test_weight_bytes_by_quantization(name: str, gib: float) -> None:
    assert weights_from_config(shape_of(name)).total_bytes / GIB == pytest.approx(gib, abs=0.02)


def test_quantization_configs() -> None:
    assert shape_of("Qwen--Qwen2.5-32B-Instruct-AWQ").quantization.label == "awq (4-bit, group 128)"
    gptq = shape_of("Qwen--Qwen2.5-7B-Instruct-GPTQ-Int4").quantization
    assert (gptq.method, gptq.bits, gptq.has_g_idx) == ("gptq", 4, True)
    fp8 = shape_of("RedHatAI--Meta-Llama-3.1-8B-Instruct-FP8").quantization
    assert (fp8.method, fp8.bits) == ("compressed-tensors", 8)
    assert shape_of("meta-llama--Llama-3.1-8B-Instruct").quantization.method is None


def test_mla_shape() -> None:
    s = shape_of("deepseek-ai--DeepSeek-V2-Lite-Chat")
    assert s.is_mla and (s.kv_lora_rank, s.qk_rope_head_dim) == (512, 64)
    assert (s.num_experts, s.experts_per_token, s.dense_layers) == (64, 6, 1)
    assert s.max_context == 163840  # YaRN: 4096 x 40, as vLLM derives it


def test_gemma2_slides_on_every_other_layer() -> None:
    s = shape_of("google--gemma-2-9b-it")
    assert (s.sliding_window, s.sliding_layers, s.full_attention_layers) == (4096, 21, 21)
    assert s.head_dim == 256 and s.tie_word_embeddings


def test_qwen_sliding_window_is_off_unless_enabled() -> None:
    assert shape_of("Qwen--Qwen2.5-7B-Instruct").sliding_layers == 0
    cfg = config_of("Qwen--Qwen2.5-7B-Instruct") | {"use_sliding_window": True, "sliding_window": 4096}
    assert parse_config(cfg).sliding_layers == 28


def test_layer_types_list_wins() -> None:
    cfg = config_of("meta-llama--Llama-3.1-8B-Instruct") | {
        "sliding_window": 512, "layer_types": ["sliding_attention", "full_attention"] * 16}
    assert parse_config(cfg).sliding_layers == 16


def test_context_lengths() -> None:
    assert shape_of("meta-llama--Llama-3.1-8B-Instruct").max_context == 131072
    assert shape_of("Qwen--Qwen2.5-7B-Instruct").max_context == 32768


def test_missing_key_is_named() -> None:
    cfg = config_of("meta-llama--Llama-3.1-8B-Instruct")
    del cfg["num_hidden_layers"]
    with pytest.raises(ModelShapeError, match="num_hidden_layers"):
        parse_config(cfg, "broken")


def test_multimodal_text_config() -> None:
    text = config_of("meta-llama--Llama-3.1-8B-Instruct")
    s = parse_config({"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "text_config": text})
    assert s.num_layers == 32 and s.num_kv_heads == 8
