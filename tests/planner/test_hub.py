"""The Hub path, for real: huggingface_hub reads config.json and the safetensors headers over HTTP (a local
stand-in for the Hub), never the weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from stack.planner.model_sources import load_facts
from stack.planner.weights import weights_from_folder

from .conftest import FIXTURES


def _publish(root: Path, repo: str, sharded: bool) -> Path:
    folder = root / repo
    folder.mkdir(parents=True)
    shutil.copy(FIXTURES / "HuggingFaceTB--SmolLM2-135M-Instruct.json", folder / "config.json")
    big = {"model.embed_tokens.weight": torch.zeros(2048, 64, dtype=torch.bfloat16),
           "model.layers.0.mlp.up_proj.weight": torch.zeros(128, 64, dtype=torch.bfloat16)}
    if sharded:
        save_file({k: v for k, v in big.items() if "embed" in k}, str(folder / "model-00001-of-00002.safetensors"))
        save_file({k: v for k, v in big.items() if "embed" not in k},
                  str(folder / "model-00002-of-00002.safetensors"))
        weight_map = {k: f"model-0000{1 if 'embed' in k else 2}-of-00002.safetensors" for k in big}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    else:
        save_file(big, str(folder / "model.safetensors"))
    return folder


def test_hub_single_file(hub_standin: Path) -> None:
    folder = _publish(hub_standin, "acme/tiny", sharded=False)
    facts = load_facts("acme/tiny")
    assert facts.config_source == "config.json of acme/tiny@main (Hugging Face Hub)"
    assert facts.shape.num_layers == 30
    assert facts.weights.source == "Hub safetensors metadata of acme/tiny@main"
    local = weights_from_folder(folder)
    assert local is not None and facts.weights.total_bytes == local.total_bytes == (2048 + 128) * 64 * 2


def test_hub_sharded(hub_standin: Path) -> None:
    _publish(hub_standin, "acme/sharded", sharded=True)
    facts = load_facts("acme/sharded")
    assert facts.weights.total_bytes == (2048 + 128) * 64 * 2
    assert facts.weights.quantizable_params == 128 * 64  # the embedding is not a linear layer


def test_hub_without_safetensors_falls_back_to_the_config(hub_standin: Path) -> None:
    (hub_standin / "acme" / "bin").mkdir(parents=True)
    shutil.copy(FIXTURES / "HuggingFaceTB--SmolLM2-135M-Instruct.json", hub_standin / "acme" / "bin" / "config.json")
    facts = load_facts("acme/bin")
    assert "estimated from config.json" in facts.weights.source
