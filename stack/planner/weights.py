"""Weight bytes of a model: from safetensors headers (a local folder, or the Hub's metadata without
downloading weights), or estimated from config.json when neither is at hand."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stack.planner.errors import ModelShapeError
from stack.planner.model_meta import ModelShape

SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1, "F4": 0.5, "F6_E2M3": 0.75,
}
# A safetensors header is a JSON object of at most 100 MB (the format's own limit).
MAX_HEADER_BYTES = 100_000_000
# Tensors that stay in the model dtype when vLLM quantizes on load (quantization: fp8).
NOT_QUANTIZED_ON_LOAD = ("embed", "lm_head", "norm", "wte", "wpe", "gate.weight", "router")


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def count(self) -> int:
        return math.prod(self.shape) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return int(self.count * SAFETENSORS_DTYPE_BYTES.get(self.dtype, 2))


@dataclass(frozen=True)
class Weights:
    """Total weight bytes, and the part vLLM would quantize to fp8 on load (linear layers in 16 bits)."""

    total_bytes: int
    source: str
    quantizable_params: int = 0
    quantizable_bytes: int = 0

    def on_load(self, quantization: str | None) -> int:
        """Bytes once loaded, with `quantization` (vLLM's option) applied to a 16-bit checkpoint."""
        if quantization in {"fp8", "ptpc_fp8", "fbgemm_fp8"} and self.quantizable_bytes:
            return self.total_bytes - self.quantizable_bytes + self.quantizable_params
        return self.total_bytes


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one .safetensors file (8-byte little-endian length, then JSON): no weights read."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ModelShapeError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER_BYTES:
            raise ModelShapeError(f"{path}: safetensors header claims {length} bytes; the file is damaged")
        try:
            return json.loads(f.read(length))
        except ValueError as exc:
            raise ModelShapeError(f"{path}: safetensors header is not valid JSON ({exc})") from exc


def tensors_from_header(header: Mapping[str, Any]) -> list[Tensor]:
    return [Tensor(name, info["dtype"], tuple(info["shape"]))
            for name, info in header.items() if name != "__metadata__"]


def weights_from_tensors(tensors: Iterable[Tensor], source: str) -> Weights:
    total = quant_params = quant_bytes = 0
    for t in tensors:
        total += t.nbytes
        # 16-bit matrices of linear layers (experts stacked in 3-D included) are what fp8-on-load shrinks.
        if t.dtype in {"BF16", "F16", "F32"} and len(t.shape) >= 2 and not any(
            part in t.name for part in NOT_QUANTIZED_ON_LOAD
        ):
            quant_params += t.count
            quant_bytes += t.nbytes
    return Weights(total, source, quant_params, quant_bytes)


def weights_from_folder(folder: Path) -> Weights | None:
    """Exact bytes from the headers of a local folder's *.safetensors files; None when it has none."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    tensors = [t for f in files for t in tensors_from_header(read_safetensors_header(f))]
    return weights_from_tensors(tensors, f"safetensors headers in {folder} ({len(files)} files)")


def weights_from_hub(repo_id: str, revision: str = "main", token: str | None = None,
                     endpoint: str | None = None) -> Weights:
    """Exact bytes from the Hub's safetensors metadata: it reads each shard's header, never the weights."""
    from huggingface_hub import HfApi  # imported here: the Hub client is only needed on this path

    meta = HfApi(endpoint=endpoint, token=token).get_safetensors_metadata(repo_id, revision=revision)
    return weights_from_hub_metadata(meta, f"Hub safetensors metadata of {repo_id}@{revision}")


def weights_from_hub_metadata(meta: Any, source: str) -> Weights:
    """From a huggingface_hub SafetensorsRepoMetadata (files_metadata -> tensors -> dtype, shape)."""
    tensors = [Tensor(name, info.dtype, tuple(info.shape))
               for file_meta in meta.files_metadata.values() for name, info in file_meta.tensors.items()]
    return weights_from_tensors(tensors, source)


def estimate_parameters(shape: ModelShape) -> tuple[int, int]:
    """(parameters of linear layers, all other parameters), counted from the architecture.

    Hand-checked against published totals in tests (Llama-3.1-8B: 8,030,261,248).
    """
    h, layers = shape.hidden_size, shape.num_layers
    heads, kv, hd = shape.num_attention_heads, shape.num_kv_heads, shape.head_dim
    if shape.is_mla:
        qk = shape.qk_nope_head_dim + shape.qk_rope_head_dim
        rank = shape.kv_lora_rank or 0
        q_rank = shape.q_lora_rank
        q = h * heads * qk if not q_rank else h * q_rank + q_rank * heads * qk
        kv_up = rank * heads * (shape.qk_nope_head_dim + shape.v_head_dim)
        attn = q + h * (rank + shape.qk_rope_head_dim) + kv_up + heads * shape.v_head_dim * h
        attn_other = rank + (shape.q_lora_rank or 0)  # the latent norms
    else:
        attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
        attn_other = (heads + 2 * kv) * hd if shape.attention_bias else 0
    mats = 3 if shape.gated_mlp else 2
    dense_mlp = mats * h * shape.intermediate_size
    moe_mlp = (shape.num_experts * mats * h * shape.moe_intermediate_size
               + mats * h * shape.shared_expert_intermediate_size)
    router = h * shape.num_experts
    linear = layers * attn + shape.dense_layers * dense_mlp
    linear += shape.moe_layers * moe_mlp if shape.is_moe else layers * dense_mlp
    embeddings = shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2)
    other = embeddings + layers * (2 * h + attn_other) + h + shape.moe_layers * router
    if shape.model_type.startswith("gemma2") or shape.model_type.startswith("gemma3"):
        other += layers * 2 * h  # Gemma 2/3 norm before and after both attention and MLP
    return linear, other


def weights_from_config(shape: ModelShape) -> Weights:
    linear, other = estimate_parameters(shape)
    dtype_bytes = shape.dtype_bytes
    total = int(linear * shape.quantization.bytes_per_weight(dtype_bytes) + other * dtype_bytes)
    quantizable = linear if shape.quantization.bits >= 16 else 0
    return Weights(total, "estimated from config.json (no weight metadata at hand)",
                   quantizable, quantizable * dtype_bytes)


def machete_zero_point_bytes(shape: ModelShape, compute_capability: str | None) -> int:
    """What vLLM's Machete kernel adds to an asymmetric 4-bit checkpoint on Hopper.

    On compute capability 9.x vLLM serves AWQ/GPTQ linear layers with MacheteLinearKernel
    (choose_mp_linear_kernel tries it before Marlin), whose process_weights_after_loading turns each packed
    zero point into `-scale * zero` in the activation dtype: 16 bits per group instead of `bits`.
    Marlin (Ampere, Ada) keeps them packed, as the checkpoint does.
    """
    q = shape.quantization
    if not (q.zero_point and q.group_size and q.bits < 8 and str(compute_capability or "").startswith("9.")):
        return 0
    linear, _ = estimate_parameters(shape)
    return int(linear * (shape.dtype_bytes - q.bits / 8) / q.group_size)
