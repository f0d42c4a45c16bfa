"""Memory a LoRA-enabled engine sets aside for adapters (adr/0013-model-families-and-adapters.md).

vLLM preallocates, for each LoRA-wrapped linear layer of every decoder layer (qkv, o, gate_up, down),
stacked A (max_loras x rank x in) and B (max_loras x out x rank) buffers in the model's dtype, whatever
the adapters target; tensor parallelism shards them like the layer. The adapters kept loaded beyond the
batch (max_cpu_loras) live in host RAM, about their file size each.
"""

from __future__ import annotations

from typing import Any

from stack.planner.model_meta import ModelShape


def lora_gpu_bytes(shape: ModelShape, engine: dict[str, Any], tp: int) -> int:
    """Bytes per GPU (or of the CPU engine's RAM) for max_loras adapters at max_lora_rank; 0 without LoRA."""
    if not engine.get("enable_lora"):
        return 0
    rank = int(engine.get("max_lora_rank") or 16)
    slots = int(engine.get("max_loras") or 1)
    h, heads, kv, hd = shape.hidden_size, shape.num_attention_heads, shape.num_kv_heads, shape.head_dim
    inter = shape.intermediate_size
    qkv = h + (heads + 2 * kv) * hd
    out = heads * hd + h
    mlp = (h + 2 * inter if shape.gated_mlp else h + inter) + (inter + h)
    per_layer = rank * (qkv + out + mlp)
    return slots * per_layer * shape.num_layers * shape.dtype_bytes // max(tp, 1)


def describe(shape: ModelShape, engine: dict[str, Any], tp: int) -> str | None:
    size = lora_gpu_bytes(shape, engine, tp)
    if not size:
        return None
    return (f"LoRA: {size / 2**20:.0f} MiB for {engine.get('max_loras') or 1} adapter slot(s) at rank "
            f"{engine.get('max_lora_rank') or 16} over {shape.num_layers} layers (qkv, o, gate_up, down); "
            f"{engine.get('max_cpu_loras') or engine.get('max_loras') or 1} kept loaded in host RAM")
