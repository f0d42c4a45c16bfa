"""Convert a GGUF model to a safetensors folder vLLM can serve (run as a subprocess: it imports torch).

    python -m stack.entrypoints.run stack.model_convert MODEL.gguf OUT_DIR

transformers dequantizes the GGUF (here Q4_1) on load; we write bf16 weights with safetensors directly,
since `save_pretrained` refuses a model that still carries its GGUF quantizer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def convert(gguf: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    config = model.config
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied to embed_tokens: safetensors refuses shared tensors
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})

    data = config.to_dict()
    for key in ("quantization_config", "_name_or_path"):
        data.pop(key, None)
    data["torch_dtype"] = "bfloat16"
    # Loaded from GGUF, the config does not name its architecture; vLLM picks its model class by it.
    data["architectures"] = data.get("architectures") or [type(model).__name__]
    # The GGUF config only carries rope_parameters; vLLM's Llama code reads the top-level rope_theta.
    rope = data.get("rope_parameters") or {}
    if "rope_theta" not in data and isinstance(rope, dict) and "rope_theta" in rope:
        data["rope_theta"] = rope["rope_theta"]
    (out / "config.json").write_text(json.dumps(data, indent=2))
    tokenizer.save_pretrained(str(out))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(out))


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
    return 0
