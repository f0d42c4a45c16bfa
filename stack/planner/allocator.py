"""What PyTorch's CUDA caching allocator holds for vLLM's weight tensors, beyond their bytes (vLLM 0.26).

vLLM reports `Model loading took X GiB` from torch.cuda.memory_allocated, which counts allocator blocks,
not tensor bytes (c10/cuda/CUDACachingAllocator.cpp). A request of 10 MiB or more (kMinLargeAlloc) gets a
segment of its size rounded up to 2 MiB (kRoundLarge), and the block is split only when more than 1 MiB
(kSmallSize) would be left: a tensor that ends within 1 MiB below a 2 MiB multiple holds the whole rest.
A 32B model has hundreds of such tensors, and on a 24 GiB card the sum (~0.13 GiB for Qwen2.5-32B-AWQ)
is several percent of the KV cache. Smaller requests share 2 MiB or 20 MiB segments, split to 512 bytes.
vLLM loads weights with max_split_size_mb=20 (Worker.load_model, "to reduce fragmentation"): a request of
20 MiB or more is never split, so it holds its whole 2 MiB-rounded segment. Measured on an H200 with
bench/gpu/weights_probe.sh: Qwen2.5-7B 0.0967 GiB held beyond the tensors (this rule: 0.0967), Qwen2.5-32B-AWQ
on Marlin 0.135 (0.127).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

MIB = 1 << 20
MIN_BLOCK = 512  # kMinBlockSize: every request is rounded up to it
SMALL_SIZE = 1 * MIB  # kSmallSize: a split must leave more than this in the large pool
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: from here on a request gets its own segment
ROUND_LARGE = 2 * MIB  # kRoundLarge: such segments are rounded up to it
LOAD_MAX_SPLIT = 20 * MIB  # max_split_size_mb vLLM sets while it loads weights: larger blocks are never split


def block_bytes(size: int) -> int:
    """Bytes torch.cuda.memory_allocated counts for one fresh request of `size` bytes."""
    size = math.ceil(size / MIN_BLOCK) * MIN_BLOCK
    if size < MIN_LARGE_ALLOC:
        return size  # carved out of a shared segment: the rest stays free for the next request
    segment = math.ceil(size / ROUND_LARGE) * ROUND_LARGE
    return segment if size >= LOAD_MAX_SPLIT or segment - size <= SMALL_SIZE else size


def rounding_bytes(sizes: Iterable[int]) -> int:
    """What the allocator holds beyond the tensors' own bytes, summed over `sizes`."""
    return sum(block_bytes(s) - s for s in sizes if s > 0)
