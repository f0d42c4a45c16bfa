"""How long a first level-1 sleep's host buffers take to pin, torch's way against the sleep patch's (issue 37).

vLLM's sleep pins one host buffer per weight allocation with `torch.empty(..., pin_memory=True)`: torch rounds each
up to a power of two and `cudaHostAlloc` locks the pages on one thread. The patch's way
(stack/vllm/plugins/runtime_patches/pinned_host.py) maps exactly the size, populates the pages on several threads
and registers them. For the weight allocations of two real shapes (as torch's device allocator carves them:
fused qkv and gate_up, 2 MiB rounding) each way allocates every buffer, then one GPU->host copy into each checks
that the memory is page-locked (a pageable copy runs at a fraction of the bus). Ways alternate, twice each.

    python3 -m bench.gpu.pinned_probe --out $OUT/pinned_probe.json      (bench/gpu/run.sh pinned_probe)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

MIB = 1 << 20
GIB = 1 << 30
SHAPES = {  # hidden, intermediate, heads, kv heads, layers, vocabulary (untied embeddings)
    "qwen2.5-7b": (3584, 18944, 28, 4, 28, 152064),
    "llama-3.1-8b": (4096, 14336, 32, 8, 32, 128256),
}


def segment(nbytes: int) -> int:
    """The segment torch's caching allocator asks vLLM's CuMemAllocator for, for one large tensor."""
    return -(-nbytes // (2 * MIB)) * 2 * MIB


def allocations(shape: tuple[int, ...]) -> list[int]:
    hidden, inter, heads, kv, layers, vocab = shape
    head = hidden // heads
    per_layer = [(hidden + 2 * kv * head) * hidden, hidden * hidden, 2 * inter * hidden, hidden * inter]
    sizes = [segment(vocab * hidden * 2)] * 2  # embedding and lm_head, bf16
    sizes += [segment(n * 2) for _ in range(layers) for n in per_layer]
    return sizes


def pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def one_round(way: str, sizes: list[int], source: Any, torch: Any) -> dict[str, Any]:
    from stack.vllm.plugins.runtime_patches.pinned_host import PinnedHost

    host = PinnedHost(torch, way="torch" if way == "torch" else "register")
    if way == "register-1-thread":
        import os

        os.environ["VSTACK_PIN_THREADS"] = "1"
    t0 = time.perf_counter()
    buffers = [host.buffer(n) for n in sizes]
    allocated = time.perf_counter() - t0
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    for buf in buffers:
        buf.copy_(source[: buf.numel()])
    torch.cuda.synchronize()
    copied = time.perf_counter() - t1
    total = sum(sizes)
    pinned = sum(pow2(n) for n in sizes) if way == "torch" else total
    del buffers
    empty = getattr(torch._C, "_host_emptyCache", None)
    if empty:
        empty()  # torch keeps freed pinned blocks: give them back so the next round allocates afresh
    import os

    os.environ.pop("VSTACK_PIN_THREADS", None)
    return {"way": way, "gib": round(total / GIB, 2), "pinned_gib": round(pinned / GIB, 2),
            "allocate_s": round(allocated, 3), "allocate_gbps": round(total / allocated / 1e9, 2),
            "copy_s": round(copied, 3), "copy_gbps": round(total / copied / 1e9, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ways", default="torch,register,register-1-thread")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    import torch

    rows: list[dict[str, Any]] = []
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    for model, shape in SHAPES.items():
        sizes = allocations(shape)
        source = torch.empty(max(sizes), dtype=torch.uint8, device="cuda")
        for _ in range(args.repeat):
            for way in args.ways.split(","):
                row = {"model": model, "buffers": len(sizes), **one_round(way, sizes, source, torch)}
                rows.append(row)
                print(json.dumps(row), flush=True)
                args.out.write_text(json.dumps(result, indent=1))
        del source
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
