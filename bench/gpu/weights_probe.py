"""Where vLLM's `Model loading took X GiB` goes, tensor by tensor, against the planner's weight figures.

Loads one fixture shape with dummy weights in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, eager), then
reads from the worker: vLLM's model_memory_usage, the bytes of every parameter and buffer, and the size of
the caching-allocator block each one sits in (torch.cuda.memory_snapshot). Beside them, the planner's
weights (config estimate), its tensor list (stack.planner.weight_tensors) and allocator rounding
(stack.planner.allocator). Run on the lent GPU by bench/gpu/weights_probe.sh; prints one JSON line.

    [VLLM_DISABLED_KERNELS=MacheteLinearKernel] python -m bench.gpu.weights_probe FIXTURE [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

GIB = 1024**3


def worker_figures(worker: Any) -> dict[str, Any]:
    import torch

    worker = getattr(worker, "worker", worker)
    runner = worker.model_runner
    blocks: dict[int, tuple[int, int]] = {}  # block start -> (size, end)
    for seg in torch.cuda.memory_snapshot():
        for blk in seg["blocks"]:
            if blk["state"] == "active_allocated":
                blocks[blk["address"]] = (blk["size"], blk["address"] + blk["size"])
    starts = sorted(blocks)
    import bisect

    seen: set[int] = set()
    tensors = []
    for name, t in list(runner.model.named_parameters()) + list(runner.model.named_buffers()):
        if t.device.type != "cuda" or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        nbytes = t.untyped_storage().nbytes()
        i = bisect.bisect_right(starts, t.data_ptr()) - 1
        block = blocks[starts[i]][0] if i >= 0 and t.data_ptr() < blocks[starts[i]][1] else None
        tensors.append({"name": name, "shape": list(t.shape), "dtype": str(t.dtype), "bytes": nbytes,
                        "block": block})
    return {"model_memory_usage": int(runner.model_memory_usage), "tensors": tensors,
            "memory_allocated": torch.cuda.memory_allocated()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("fixture")
    parser.add_argument("--set", action="append", default=[], help="engine option key=value (JSON value)")
    parser.add_argument("--work", default="/tmp/vstack-weights-probe")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    from bench.harness.dummy_models import fixture_config, write_model
    from stack.planner.allocator import block_bytes, rounding_bytes
    from stack.planner.model_meta import parse_config
    from stack.planner.weight_tensors import weight_tensor_sizes
    from stack.planner.weights import machete_zero_point_bytes, weights_from_config

    options: dict[str, Any] = {"load_format": "dummy", "enforce_eager": True, "max_model_len": 2048,
                               "gpu_memory_utilization": 0.5}
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    config = fixture_config(args.fixture)
    folder = write_model(Path(args.work) / args.fixture, config)
    shape = parse_config(config, args.fixture)

    import torch
    from vllm import LLM

    llm = LLM(model=str(folder), **options)
    got = llm.collective_rpc(worker_figures)[0]
    cc = ".".join(map(str, torch.cuda.get_device_capability()))
    quant = options.get("quantization")
    planned = weights_from_config(shape).on_load(quant)
    machete = 0 if "Machete" in os.environ.get("VLLM_DISABLED_KERNELS", "") else machete_zero_point_bytes(shape, cc)
    sizes = weight_tensor_sizes(shape, quant)
    tensors = got.pop("tensors")
    measured_bytes = sum(t["bytes"] for t in tensors)
    measured_blocks = sum(t["block"] or t["bytes"] for t in tensors)
    top = sorted(tensors, key=lambda t: -((t["block"] or t["bytes"]) - t["bytes"]))[: args.top]
    result = {
        "fixture": args.fixture, "options": options, "compute_capability": cc,
        "disabled_kernels": os.environ.get("VLLM_DISABLED_KERNELS", ""),
        "vllm_model_memory_gib": round(got["model_memory_usage"] / GIB, 4),
        "tensor_bytes_gib": round(measured_bytes / GIB, 4),
        "tensor_blocks_gib": round(measured_blocks / GIB, 4),
        "measured_rounding_gib": round((measured_blocks - measured_bytes) / GIB, 4),
        "tensors": len(tensors),
        "planner_weights_gib": round((planned + machete) / GIB, 4),
        "planner_tensor_sum_gib": round(sum(sizes) / GIB, 4),
        "planner_tensors": len(sizes),
        "planner_rounding_gib": round(rounding_bytes(sizes) / GIB, 4),
        "rounding_rule_on_measured_gib": round(
            sum(block_bytes(t["bytes"]) - t["bytes"] for t in tensors) / GIB, 4),
        "largest_rounding": [{k: t[k] for k in ("name", "shape", "dtype", "bytes", "block")} for t in top],
    }
    print("WEIGHTS_PROBE " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
