"""The engine settings worth measuring for goodput on a device, each only where vLLM and the hardware have it.

Ordered by what moved goodput most where it was measured (../shared/gpu: fp8 weights served 28.1 req/s
against 25.6 for the defaults on an H100, with a lower p95 TPOT), so `--max-candidates N` keeps the N most
promising. What is left out is listed with the reason (not in this vLLM, not on this hardware, already
vLLM's default), and every candidate that changes the numbers the model computes says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stack.tune.candidates import Candidate
from stack.vllm.options import VllmCatalog

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


@dataclass(frozen=True)
class Skipped:
    label: str
    reason: str


@dataclass(frozen=True)
class Device:
    """What decides which knobs apply: the hardware profile, the installed vLLM, the model, the workload."""

    accelerator: str  # gpu | cpu
    fp8: bool  # the hardware profile's fp8 (Hopper, Ada)
    catalog: VllmCatalog
    engine: dict[str, Any]  # the profile's engine options as resolved (what the baseline runs)
    model_quant: str | None = None  # config.json quantization_config.quant_method (awq, gptq, fp8, ...)
    shared_prefix: bool = False  # the scenario's prompts share a prefix


def numerics_change(overrides: dict[str, Any]) -> str | None:
    """Why a candidate may answer differently from the baseline at temperature 0, or None."""
    why = []
    if overrides.get("quantization"):
        why.append(f"weights quantization {overrides['quantization']}")
    kv = overrides.get("kv_cache_dtype")
    if kv not in (None, "auto"):
        why.append(f"KV cache {kv}")
    if overrides.get("speculative_config"):
        why.append("speculative decoding")
    if overrides.get("dtype") not in (None, "auto"):
        why.append(f"dtype {overrides['dtype']}")
    return ", ".join(why) or None


def model_quantization(model_dir: Path | None) -> str | None:
    if model_dir is None or not (model_dir / "config.json").is_file():
        return None
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    q = cfg.get("quantization_config") or {}
    return str(q.get("quant_method") or "").lower() or None


def device_candidates(d: Device) -> tuple[list[Candidate], list[Skipped]]:
    """The knobs in order of promise; the baseline is not among them (build_candidates puts it first)."""
    found: list[dict[str, Any]] = []
    skipped: list[Skipped] = []

    def offer(label: str, overrides: dict[str, Any], needs: list[str], why_not: str | None) -> None:
        missing = [k for k in needs if k not in d.catalog]
        if missing:
            skipped.append(Skipped(label, f"vLLM {d.catalog.version} has no --{missing[0].replace('_', '-')}"))
        elif why_not:
            skipped.append(Skipped(label, why_not))
        elif any(d.engine.get(k) == v for k, v in overrides.items()):
            skipped.append(Skipped(label, "the profile sets it already"))
        else:
            found.append(overrides)

    gpu = d.accelerator == "gpu"
    unquantized = d.model_quant in (None, "")
    not_gpu = None if gpu else "GPU only"
    fp8_why = not_gpu or (None if d.fp8 else "this GPU has no fp8 (Hopper or Ada needed)")
    offer("fp8 weights", {"quantization": "fp8"}, ["quantization"],
          fp8_why or (None if unquantized else f"the model is quantized already ({d.model_quant})"))
    if d.model_quant == "awq":
        offer("AWQ-Marlin kernels", {"quantization": "awq_marlin"}, ["quantization"], not_gpu)
    offer("fp8 KV cache", {"kv_cache_dtype": "fp8"}, ["kv_cache_dtype"],
          fp8_why or (None if d.engine.get("kv_cache_dtype") in (None, "auto") else "the profile sets a KV dtype"))
    if gpu and d.fp8 and unquantized and "quantization" in d.catalog and "kv_cache_dtype" in d.catalog:
        offer("fp8 weights + fp8 KV", {"quantization": "fp8", "kv_cache_dtype": "fp8"}, [], None)
    if gpu:
        offer("larger token budget", {"max_num_batched_tokens": 16384}, ["max_num_batched_tokens"], None)
        offer("smaller token budget", {"max_num_batched_tokens": 2048}, ["max_num_batched_tokens"], None)
        offer("fewer sequences", {"max_num_seqs": 128}, ["max_num_seqs"], None)
    else:
        offer("few sequences", {"max_num_seqs": 4}, ["max_num_seqs"], None)
        offer("more sequences, larger budget", {"max_num_seqs": 32, "max_num_batched_tokens": 4096},
              ["max_num_seqs", "max_num_batched_tokens"], None)
    async_default = d.catalog.options["async_scheduling"].default if "async_scheduling" in d.catalog else None
    offer("async scheduling", {"async_scheduling": True}, ["async_scheduling"],
          not_gpu or ("vLLM turns it on by itself where it is supported (its default is auto)"
                      if async_default is None else None))
    offer("ngram speculative decoding", {"speculative_config": NGRAM}, ["speculative_config"], not_gpu)
    offer("no prefix caching", {"enable_prefix_caching": False}, ["enable_prefix_caching"],
          "the prompts share a prefix: caching it is the point" if d.shared_prefix else None)
    offer("CUDA graphs up to 1024", {"max_cudagraph_capture_size": 1024, "max_num_seqs": 1024},
          ["max_cudagraph_capture_size", "max_num_seqs"], not_gpu)
    return [Candidate(o) for o in found], skipped
