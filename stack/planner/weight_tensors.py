"""The tensors vLLM holds on one GPU for a model's weights, as it lays them out once loaded.

vLLM fuses a checkpoint's q/k/v into one `qkv_proj` and gate/up into `gate_up_proj`, stacks a MoE layer's
experts into `w13_weight` and `w2_weight`, shards columns (qkv, gate_up, experts) or rows (o, down) across
tensor-parallel ranks, pads the vocabulary to a multiple of 64, and keeps a rotary cos/sin cache per model.
Their sizes are what the caching allocator rounds (stack.planner.allocator); their sum is checked against
the weight bytes in tests.
"""

from __future__ import annotations

import math

from stack.planner.model_meta import ModelShape

VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE (VocabParallelEmbedding)


def linear_tensors(rows: int, cols: int, shape: ModelShape, on_load_bits: int) -> list[int]:
    """Bytes of the tensors of one linear layer with `rows` inputs and `cols` outputs on one rank."""
    q, b = shape.quantization, shape.dtype_bytes
    if on_load_bits >= 16:
        return [rows * cols * b]
    if on_load_bits == 8:
        return [rows * cols, cols * 4]  # fp8/int8 weight and a per-channel float32 scale
    tensors = [rows * cols * on_load_bits // 8]  # packed int32 (Marlin repacks it to the same bytes)
    if q.group_size:
        groups = math.ceil(rows / q.group_size)
        tensors.append(groups * cols * b)  # scales
        if q.zero_point:
            tensors.append(groups * cols * on_load_bits // 8)  # packed zero points
    if q.has_g_idx:
        tensors.append(rows * 4)
    return tensors


def weight_tensor_sizes(shape: ModelShape, quantization: str | None = None, tp: int = 1) -> list[int]:
    """Bytes of every weight tensor vLLM allocates on one of `tp` ranks (`quantization`: vLLM's option)."""
    b, h, layers = shape.dtype_bytes, shape.hidden_size, shape.num_layers
    bits = shape.quantization.bits
    if bits >= 16 and quantization in {"fp8", "ptpc_fp8", "fbgemm_fp8"}:
        bits = 8

    def linear(rows: int, cols: int) -> list[int]:
        return linear_tensors(rows, cols, shape, bits)

    def mlp(inter: int) -> list[int]:
        gate_up = (2 if shape.gated_mlp else 1) * inter // tp
        return linear(h, gate_up) + linear(inter // tp, h)

    per_layer: list[int] = [h * b, h * b]  # the two norms
    heads = max(1, shape.num_attention_heads // tp)
    if shape.is_mla:
        qk = shape.qk_nope_head_dim + shape.qk_rope_head_dim
        rank = shape.kv_lora_rank or 0
        if shape.q_lora_rank:
            per_layer += linear(h, shape.q_lora_rank) + linear(shape.q_lora_rank, heads * qk)
            per_layer.append(shape.q_lora_rank * b)
        else:
            per_layer += linear(h, heads * qk)
        per_layer += [*linear(h, rank + shape.qk_rope_head_dim), rank * b]
        per_layer += linear(rank, heads * (shape.qk_nope_head_dim + shape.v_head_dim))
        per_layer += linear(heads * shape.v_head_dim, h)
    else:
        kv = max(1, shape.num_kv_heads // tp)  # fewer KV heads than ranks: each rank keeps a copy
        qkv = (heads + 2 * kv) * shape.head_dim
        per_layer += linear(h, qkv) + ([qkv * b] if shape.attention_bias else [])
        per_layer += linear(heads * shape.head_dim, h)
    if shape.model_type.startswith(("gemma2", "gemma3")):
        per_layer += [h * b, h * b]
    dense = mlp(shape.intermediate_size)
    tensors = per_layer * layers
    if shape.is_moe:
        inter = shape.moe_intermediate_size // tp
        experts = [shape.num_experts * h * (2 if shape.gated_mlp else 1) * inter * bits // 8,
                   shape.num_experts * inter * h * bits // 8, shape.num_experts * h * b]
        if shape.shared_expert_intermediate_size:
            experts += mlp(shape.shared_expert_intermediate_size)
        tensors += experts * shape.moe_layers + dense * shape.dense_layers
    else:
        tensors += dense * layers
    vocab = math.ceil(shape.vocab_size / VOCAB_PADDING) * VOCAB_PADDING // tp
    tensors += [vocab * h * b] * (1 if shape.tie_word_embeddings else 2) + [h * b]
    rotary = shape.qk_rope_head_dim if shape.is_mla else shape.head_dim
    tensors.append(shape.max_context * rotary * b)  # RotaryEmbedding.cos_sin_cache, one per model
    return tensors
