"""Why a wake copies below the bus (issue 14, item 2): vLLM's sleep-mode allocator alone, in one process, with
Llama-3.1-8B-shaped weight allocations and a KV cache, each step timed on its own.

    python3 -m bench.gpu.wake_probe [--kv-gib 64] [--repeat 3]      (bench/gpu/wake_probe.sh on the lent GPU)

Steps (GB/s = bytes moved / seconds, one synchronize at the end of each):
  bus            one pinned 4 GiB buffer -> cudaMalloc memory (torch): the reference
  upstream       CuMemAllocator.sleep/wake_up as vLLM ships them (sync cudaMemcpy per allocation)
  patched        stack/vllm/plugins/runtime_patches/fast_sleep_wake (kept host copy, async copies) - wake
                 weights, wake KV cache, and both in one call
  kept->malloc   the patched run's kept host buffers copied into plain cudaMalloc tensors: is it the source?
  arena->cumem   one pinned arena copied into the allocator's freshly mapped weights: is it the destination?
Prints one `WAKE_PROBE {json}` line per step.
"""

from __future__ import annotations

import argparse
import json
import logging
import time

GIB = 1024**3


def llama8b_sizes() -> list[int]:
    h, kv, inter, vocab, layers = 4096, 1024, 14336, 128256, 32
    per_layer = [(h + 2 * kv) * h * 2, h * h * 2, 2 * inter * h * 2, inter * h * 2, h * 2, h * 2]
    return [vocab * h * 2, *per_layer * layers, h * 2, vocab * h * 2]


def say(step: str, **fields: object) -> None:
    print("WAKE_PROBE " + json.dumps({"step": step, **fields}), flush=True)


def timed(fn) -> float:
    import torch

    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kv-gib", type=float, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import torch
    from vllm.device_allocator.cumem import CuMemAllocator

    from stack.vllm.plugins.runtime_patches import fast_sleep_wake as fsw
    from stack.vllm.plugins.runtime_patches.cuda_ops import CudaOps

    upstream_sleep, upstream_wake = CuMemAllocator.sleep, CuMemAllocator.wake_up
    bus()
    torch.cuda.empty_cache()

    alloc = CuMemAllocator.get_instance()
    sizes = llama8b_sizes()
    with alloc.use_memory_pool(tag="weights"):
        weights = [torch.empty(s, dtype=torch.uint8, device="cuda") for s in sizes]
    for w in weights:
        w.random_(0, 255)
    checksum = [int(w[:64].sum()) for w in weights]
    kv_n = max(1, int(args.kv_gib // 2))
    with alloc.use_memory_pool(tag="kv_cache"):
        kv = [torch.empty(2 * GIB, dtype=torch.uint8, device="cuda") for _ in range(kv_n)]
    wbytes = sum(sizes)
    say("setup", weights_gib=round(wbytes / GIB, 2), allocations=len(sizes), kv_gib=kv_n * 2)

    for r in range(args.repeat):  # vLLM as shipped
        s = timed(lambda: upstream_sleep(alloc, offload_tags=("weights",)))
        ww = timed(lambda: upstream_wake(alloc, ["weights"]))
        wk = timed(lambda: upstream_wake(alloc, ["kv_cache"]))
        say("upstream", round=r, sleep_s=round(s, 3), wake_weights_s=round(ww, 3), wake_kv_s=round(wk, 3),
            weights_gbps=round(wbytes / ww / 1e9, 1))  # fmt: skip
    ops = CudaOps()
    for r in range(args.repeat):  # the runtime patch, host copy kept
        s = timed(lambda: fsw.sleep(alloc, ("weights",), ops, keep=True))
        ww = timed(lambda: fsw.wake_up(alloc, ["weights"], ops, keep=True))
        wk = timed(lambda: fsw.wake_up(alloc, ["kv_cache"], ops, keep=True))
        s2 = timed(lambda: fsw.sleep(alloc, ("weights",), ops, keep=True))
        wa = timed(lambda: fsw.wake_up(alloc, None, ops, keep=True))
        say("patched", round=r, sleep_s=round(s, 3), wake_weights_s=round(ww, 3), wake_kv_s=round(wk, 3),
            weights_gbps=round(wbytes / ww / 1e9, 1), sleep2_s=round(s2, 3), wake_all_s=round(wa, 3))  # fmt: skip
    ok = [int(w[:64].sum()) for w in weights] == checksum
    say("weights_intact", ok=ok)

    kept = [data._vstack_host for data in alloc.pointer_to_data.values() if data.tag == "weights"]
    one = torch.empty(sum(k.numel() for k in kept), dtype=torch.uint8, pin_memory=True)
    to_malloc(kept, one, args.repeat)
    torch.cuda.empty_cache()
    datas = [(ptr, data) for ptr, data in alloc.pointer_to_data.items() if data.tag == "weights"]
    for r in range(args.repeat):
        fsw.sleep(alloc, ("weights",), ops, keep=True)
        t0 = time.perf_counter()
        at = 0
        for ptr, data in datas:
            ops.map(data.handle)
            data.is_asleep = False
            ops.to_device(ptr, one.data_ptr() + at, data.handle[1])
            at += data.handle[1]
        ops.wait()
        t = time.perf_counter() - t0
        for _ptr, data in datas:
            data.cpu_backup_tensor = None
        fsw.wake_up(alloc, ["kv_cache"], ops, keep=True)
        say("arena->cumem", round=r, seconds=round(t, 3), gbps=round(wbytes / t / 1e9, 1))
    say("done", kv_allocations=len(kv))


def bus() -> None:
    import torch

    n = 4 * GIB
    h, d = torch.empty(n, dtype=torch.uint8, pin_memory=True), torch.empty(n, dtype=torch.uint8, device="cuda")
    best = min(timed(lambda: d.copy_(h, non_blocking=True)) for _ in range(4))
    say("bus", gbps=round(n / best / 1e9, 1))


def to_malloc(kept, one, repeat: int) -> None:
    """The kept host buffers, then one arena of the same bytes, into plain cudaMalloc tensors."""
    import torch

    plain = [torch.empty(k.numel(), dtype=torch.uint8, device="cuda") for k in kept]
    total = sum(k.numel() for k in kept)
    for r in range(repeat):
        t = timed(lambda: [p.copy_(k, non_blocking=True) for p, k in zip(plain, kept, strict=True)])
        say("kept->malloc", round=r, seconds=round(t, 3), gbps=round(total / t / 1e9, 1))
    for r in range(repeat):
        t = timed(lambda: [p.copy_(one[o : o + p.numel()], non_blocking=True)
                           for p, o in zip(plain, offsets(plain), strict=True)])  # fmt: skip
        say("arena->malloc", round=r, seconds=round(t, 3), gbps=round(total / t / 1e9, 1))


def offsets(tensors) -> list[int]:
    out, at = [], 0
    for t in tensors:
        out.append(at)
        at += t.numel()
    return out


if __name__ == "__main__":
    main()
