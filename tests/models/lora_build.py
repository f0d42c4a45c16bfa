"""Real LoRA adapters for SmolLM2, written with PEFT: non-zero (lora_B random, not PEFT's zeros), so each
changes the model's answers. Run in a subprocess (transformers + peft imports take a while and memory)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path


def build(model_dir: str, out_dir: str, specs: list[dict]) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    for spec in specs:
        torch.manual_seed(spec["seed"])
        config = LoraConfig(r=spec["rank"], lora_alpha=2 * spec["rank"], target_modules=["q_proj", "v_proj"],
                            lora_dropout=0.0, task_type="CAUSAL_LM")
        model = get_peft_model(copy.deepcopy(base), config)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, spec.get("scale", 0.05))
        target = Path(out_dir) / spec["name"]
        model.save_pretrained(target)
        assert json.loads((target / "adapter_config.json").read_text())["r"] == spec["rank"]


if __name__ == "__main__":
    build(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
