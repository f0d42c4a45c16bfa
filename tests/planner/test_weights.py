"""Weight bytes from safetensors headers (local), from the Hub's metadata objects, and on-load fp8."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from huggingface_hub.utils import SafetensorsFileMetadata, SafetensorsRepoMetadata, TensorInfo
from safetensors.torch import save_file

from stack.planner.errors import ModelShapeError
from stack.planner.weights import (
    read_safetensors_header,
    tensors_from_header,
    weights_from_folder,
    weights_from_hub_metadata,
)


def _write(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {
        "model.embed_tokens.weight": torch.zeros(100, 16, dtype=torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": torch.zeros(16, 16, dtype=torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.zeros(32, 16, dtype=torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.zeros(16, dtype=torch.bfloat16),
        "model.layers.0.mlp.down_proj.qweight": torch.zeros(4, 16, dtype=torch.int32),
    }
    folder.mkdir(exist_ok=True)
    save_file(dict(list(tensors.items())[:3]), str(folder / "model-00001-of-00002.safetensors"))
    save_file(dict(list(tensors.items())[3:]), str(folder / "model-00002-of-00002.safetensors"))
    return tensors


def test_local_headers_give_exact_bytes(tmp_path: Path) -> None:
    tensors = _write(tmp_path)
    w = weights_from_folder(tmp_path)
    assert w is not None
    assert w.total_bytes == sum(t.numel() * t.element_size() for t in tensors.values())
    # fp8 on load shrinks the 16-bit linear matrices only (not embeddings, norms, or packed int32)
    assert w.quantizable_params == 16 * 16 + 32 * 16
    assert w.on_load("fp8") == w.total_bytes - (16 * 16 + 32 * 16)
    assert w.on_load(None) == w.total_bytes


def test_folder_without_safetensors(tmp_path: Path) -> None:
    assert weights_from_folder(tmp_path) is None


def test_damaged_header(tmp_path: Path) -> None:
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(struct.pack("<Q", 10) + b"not json!!")
    with pytest.raises(ModelShapeError, match="not valid JSON"):
        read_safetensors_header(bad)
    bad.write_bytes(b"abc")
    with pytest.raises(ModelShapeError, match="not a safetensors file"):
        read_safetensors_header(bad)


def test_hub_metadata_objects(tmp_path: Path) -> None:
    """What HfApi.get_safetensors_metadata returns, built from real headers: same bytes as the local path."""
    _write(tmp_path)
    files = {}
    for f in sorted(tmp_path.glob("*.safetensors")):
        header = read_safetensors_header(f)
        files[f.name] = SafetensorsFileMetadata(
            metadata=header.get("__metadata__", {}),
            tensors={t.name: TensorInfo(dtype=t.dtype, shape=list(t.shape),
                                        data_offsets=tuple(header[t.name]["data_offsets"]))
                     for t in tensors_from_header(header)})
    weight_map = {name: fname for fname, meta in files.items() for name in meta.tensors}
    meta = SafetensorsRepoMetadata(metadata=None, sharded=True, weight_map=weight_map, files_metadata=files)
    hub = weights_from_hub_metadata(meta, "hub")
    local = weights_from_folder(tmp_path)
    assert local is not None and hub.total_bytes == local.total_bytes
    assert hub.quantizable_params == local.quantizable_params


def test_header_json_roundtrip(tmp_path: Path) -> None:
    header = {"__metadata__": {"format": "pt"}, "w": {"dtype": "F8_E4M3", "shape": [4, 8], "data_offsets": [0, 32]}}
    raw = json.dumps(header).encode()
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(32))
    w = weights_from_folder(tmp_path)
    assert w is not None and w.total_bytes == 32 and w.quantizable_params == 0


def test_machete_keeps_awq_zero_points_in_16_bits_on_hopper_only() -> None:
    """vLLM's MacheteLinearKernel (Hopper) stores `-scale * zero` per group in the activation dtype; Marlin
    (Ampere/Ada) keeps the packed 4-bit zero points. GPTQ sym=true has no zero points at all."""
    import json

    from stack.planner.model_meta import parse_config
    from stack.planner.model_sources import known_config_path
    from stack.planner.weights import estimate_parameters, machete_zero_point_bytes

    awq = parse_config(json.loads(known_config_path("Qwen/Qwen2.5-32B-Instruct-AWQ").read_text()))
    gptq = parse_config(json.loads(known_config_path("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4").read_text()))
    assert awq.quantization.zero_point and not gptq.quantization.zero_point
    linear, _ = estimate_parameters(awq)
    extra = machete_zero_point_bytes(awq, "9.0")
    assert extra == int(linear * (2 - 0.5) / 128)
    assert 0.3 * 2**30 < extra < 0.4 * 2**30  # 31.2 B linear weights: the 0.34 GiB seen on the H200
    assert machete_zero_point_bytes(awq, "8.9") == 0
    assert machete_zero_point_bytes(gptq, "9.0") == 0
