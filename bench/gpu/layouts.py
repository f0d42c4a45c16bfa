"""Layout rows: the planner's KV token count against vLLM's own, one real model shape per attention layout.

Each row starts vLLM directly (dummy weights of the real shape, eager: the KV cache is sized before CUDA
graphs would be captured), waits for `KV cache size: N tokens`, stops it, and asks the planner the same
question with the same options on the same GPU (`fit_model`, the path `vstack plan` takes). Shapes marked
`new` were not among those the planner's figures were first checked on (bench/planner_check_h200_*.json).
bench/planner_check.py runs small versions of the same layouts on the CPU build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = 1024**3


@dataclass(frozen=True)
class Layout:
    name: str
    layout: str  # the KV layout it covers (README table column)
    fixture: str
    options: dict[str, Any] = field(default_factory=dict)
    gpus: int = 1
    new: bool = True


LAYOUTS: list[Layout] = [
    Layout("llama-2-7b-mha", "full attention, MHA (32 KV heads)", "meta-llama--Llama-2-7b-hf",
           {"max_model_len": 4096}),
    Layout("qwen2.5-32b-gqa", "full attention, GQA (8 KV heads), bf16 32B", "Qwen--Qwen2.5-32B-Instruct",
           {"max_model_len": 32768}),
    Layout("mistral-7b-sliding", "sliding window 4096 on every layer", "mistralai--Mistral-7B-v0.1",
           {"max_model_len": 32768}),
    Layout("gemma-2-2b-alternating", "alternating sliding 4096 / global", "google--gemma-2-2b-it",
           {"max_model_len": 8192}),
    Layout("deepseek-v2-lite-mla", "MLA (latent 512 + rope 64) + MoE", "deepseek-ai--DeepSeek-V2-Lite-Chat",
           {"max_model_len": 32768}, new=False),
    Layout("mixtral-8x7b-moe", "MoE 8 experts, top 2", "mistralai--Mixtral-8x7B-Instruct-v0.1",
           {"max_model_len": 32768}),
    Layout("qwen2.5-7b-gptq", "GPTQ 4-bit weights", "Qwen--Qwen2.5-7B-Instruct-GPTQ-Int4",
           {"max_model_len": 32768}),
    Layout("llama-3.1-8b-fp8", "FP8 weights (compressed-tensors)", "RedHatAI--Meta-Llama-3.1-8B-Instruct-FP8",
           {"max_model_len": 32768}),
    Layout("llama-3.1-8b-fp8-kv", "fp8 KV cache", "meta-llama--Llama-3.1-8B-Instruct",
           {"max_model_len": 32768, "kv_cache_dtype": "fp8"}, new=False),
    Layout("qwen2.5-7b-tp2", "TP 2, KV heads split (4 -> 2 per GPU)", "Qwen--Qwen2.5-7B-Instruct",
           {"max_model_len": 32768, "tensor_parallel_size": 2}, gpus=2),
    Layout("gemma-2b-tp2", "TP 2, KV heads replicated (1 KV head on each GPU)", "google--gemma-2b",
           {"max_model_len": 8192, "tensor_parallel_size": 2}, gpus=2),
    Layout("deepseek-v2-lite-tp2", "TP 2, MLA latent replicated", "deepseek-ai--DeepSeek-V2-Lite-Chat",
           {"max_model_len": 32768, "tensor_parallel_size": 2}, gpus=2, new=False),
    # Eager rows (issue 33): every layout row is eager, but these are the shapes where the eager profile peak
    # was found off (a large AWQ model on a real H100, ~6% more KV planned than vLLM's) or where a term other
    # than the forward pass sets it: the dummy sampler pass (many sequences x a large vocabulary), a 70B shape.
    # vLLM's batch defaults of the GPU apply unless set. `bash bench/gpu/realweights.sh eager` runs them.
    Layout("qwen2.5-32b-awq-eager", "AWQ 4-bit 32B, eager, the GPU's batch defaults", "Qwen--Qwen2.5-32B-Instruct-AWQ",
           {"max_model_len": 32768}),
    Layout("llama-3.3-70b-fp8-eager", "70B, fp8 weights (online), eager", "meta-llama--Llama-3.3-70B-Instruct",
           {"max_model_len": 8192, "quantization": "fp8"}),
    Layout("qwen2.5-7b-gptq-eager-sampler", "GPTQ 4-bit, eager, sampler-bound (1024 seqs x 152k vocab)",
           "Qwen--Qwen2.5-7B-Instruct-GPTQ-Int4",
           {"max_model_len": 8192, "max_num_seqs": 1024, "max_num_batched_tokens": 1024}),
    Layout("gemma-2-9b-eager-vocab", "256k vocabulary, eager, 1024 seqs", "google--gemma-2-9b-it",
           {"max_model_len": 8192, "max_num_seqs": 1024}),
]
# Every layout row runs with these unless it sets them: vLLM's default utilization, eager (see above).
COMMON = {"gpu_memory_utilization": 0.92, "enforce_eager": True}


def options_for(layout: Layout) -> dict[str, Any]:
    return {**COMMON, **layout.options}


def predict(layout: Layout, folder: Path, gpu_info: Any) -> dict[str, Any]:
    """The planner's figures for this shape and these options on the GPUs `gpu_info` describes."""
    from stack.config import load_config
    from stack.hardware import match_profile
    from stack.planner.fit_planner import fit_model

    cfg = load_config()
    hw, _ = match_profile(gpu_info, cfg)
    if hw.accelerator != "gpu" or hw.gpu_count > layout.gpus:  # an 8-GPU profile: plan on the 1-GPU one
        hw = next(h for h in cfg.hardware.values() if h.accelerator == "gpu" and h.gpu_count == 1
                  and any(m.lower() in gpu_info.gpus[0].name.lower() for m in h.match))
    plan = fit_model(cfg, str(folder), hw.name, engine=options_for(layout), hardware_info=gpu_info)
    return {"kv_tokens": plan.kv_tokens, "max_concurrency": round(plan.max_concurrency, 2),
            "kv_gib": round(plan.budget.kv / GIB, 3), "weights_gib": round(plan.budget.weights / GIB, 3),
            "activation_gib": round(plan.budget.activation / GIB, 3),
            "runtime_gib": round(plan.budget.runtime / GIB, 3), "hardware": hw.name}


def run_layout(layout: Layout, work: Path, log_dir: Path, gpu_info: Any) -> dict[str, Any]:
    """One layout row: vLLM's figures, the planner's, the error. Never raises."""
    import time

    from bench.harness.dummy_models import fixture_config, write_model
    from bench.harness.kv_probe import run_engine

    row: dict[str, Any] = {"row": layout.name, "kind": "layout", "layout": layout.layout, "new_shape": layout.new,
                           "fixture": layout.fixture, "options": options_for(layout)}
    try:
        folder = write_model(work / "layouts" / layout.name, fixture_config(layout.fixture))
        t0 = time.perf_counter()
        row["vllm"] = run_engine("gpu", folder, options_for(layout), log_dir / f"layout-{layout.name}.log", 420)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        row["planner"] = predict(layout, folder, gpu_info)
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[-2000:]
    predicted, actual = (row.get("planner") or {}).get("kv_tokens"), (row.get("vllm") or {}).get("kv_tokens")
    if predicted and actual:
        row["kv_error"] = round(predicted / actual - 1, 4)
    elif "error" not in row:
        row["error"] = (row.get("vllm") or {}).get("error", "no KV cache line in the engine log")
    return row
