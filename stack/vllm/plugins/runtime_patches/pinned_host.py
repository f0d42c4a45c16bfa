"""Pinned host buffers of the size asked, pinned on several threads (the first level-1 sleep's cost, issue 37).

vLLM's sleep takes its host buffers from torch (`torch.empty(..., pin_memory=True)`). torch's caching host
allocator rounds every buffer up to the next power of two before it asks CUDA (`CachingHostAllocator.h`:
`PowerOf2Ceil`), and `cudaHostAlloc` faults in and locks the pages on one thread. A Qwen2.5-7B's 271 MiB MLP
weights each pin 512 MiB, so its 15 GiB of weights pin ~27 GiB, which the engine keeps (the caching allocator
never gives pinned blocks back) while the planner counts 15. Here a buffer is an anonymous mapping of its own
size, its pages populated by several threads at once, then registered with `cudaHostRegister`: page-locked like
cudaHostAlloc's (copies run at the same speed), and unregistered and unmapped when its tensor goes.
`bench/gpu/pinned_probe.py` measures both ways on the GPU.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger("vllm.vstack_patches.pinned")

CHUNK = 64 << 20  # bytes one thread populates at a time
MADV_HUGEPAGE, MADV_POPULATE_WRITE = 14, 23  # <linux/mman.h>; POPULATE_WRITE since Linux 5.14
THREADS_ENV = "VSTACK_PIN_THREADS"  # how many threads populate a buffer's pages (default: up to 16 cores)
WAY_ENV = "VSTACK_PINNED_HOST"  # "register" (default) or "torch": torch's own pinned allocator, as vLLM does

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int

Register = Callable[[int, int], int]  # (address, size) -> CUDA error code, 0 on success
Unregister = Callable[[int], Any]


def threads() -> int:
    asked = os.environ.get(THREADS_ENV, "").strip()
    if asked.isdigit() and int(asked) > 0:
        return int(asked)
    return max(1, min(16, len(os.sched_getaffinity(0))))


def populate(address: int, size: int, workers: int) -> None:
    """Fault in every page of [address, address + size) for writing, `workers` threads at once (the kernel zeroes
    each page as it faults it: on one thread that is the slow part of pinning). ctypes calls release the GIL."""

    def one(start: int) -> None:
        n = min(CHUNK, size - start)
        if _libc.madvise(address + start, n, MADV_POPULATE_WRITE) == 0:
            return
        err = ctypes.get_errno()
        if err != errno.EINVAL:  # ENOMEM, EFAULT...: say so here rather than have a write meet the OOM killer
            raise OSError(err, f"populating host memory for a sleep buffer: {os.strerror(err)}")
        ctypes.memset(address + start, 0, n)  # a kernel before 5.14: write the pages

    starts = range(0, size, CHUNK)
    if workers <= 1 or len(starts) == 1:
        for start in starts:
            one(start)
        return
    with ThreadPoolExecutor(min(workers, len(starts)), thread_name_prefix="vstack-pin") as pool:
        list(pool.map(one, starts))


def registered_buffer(size: int, register: Register, unregister: Unregister, workers: int | None = None) -> Any:
    """A uint8 tensor of exactly `size` bytes on its own anonymous mapping, populated and registered; None when
    the registration fails (the caller falls back). The registration is undone when the tensor is collected."""
    import torch

    area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    tensor = torch.frombuffer(area, dtype=torch.uint8)
    address = tensor.data_ptr()
    _libc.madvise(address, size, MADV_HUGEPAGE)  # fewer faults and pins where THP is "madvise"; ignored elsewhere
    populate(address, size, threads() if workers is None else workers)
    err = register(address, size)
    if err:
        del tensor
        return None
    # The finalizer holds the mapping, so it outlives the registration whatever order the collector takes.
    weakref.finalize(tensor, _release, unregister, address, area).atexit = False  # exit frees it all anyway
    return tensor


def _release(unregister: Unregister, address: int, area: mmap.mmap) -> None:
    unregister(address)
    del area  # unmapped once no view of the tensor is left


class PinnedHost:
    """host_buffer for the sleep patch: registered buffers of the exact size, else torch's pinned ones."""

    def __init__(self, torch: Any, way: str | None = None) -> None:
        self.torch = torch
        self.way = (way or os.environ.get(WAY_ENV) or "register").strip().lower()
        cudart = torch.cuda.cudart()
        self._register: Register = lambda address, size: int(cudart.cudaHostRegister(address, size, 0))
        self._unregister: Unregister = lambda address: cudart.cudaHostUnregister(address)
        self._warned = False

    def buffer(self, size: int) -> Any:
        if self.way == "register":
            try:
                host = registered_buffer(size, self._register, self._unregister)
                why = "cudaHostRegister failed"
            except OSError as exc:  # the mapping or its pages could not be had
                host, why = None, str(exc)
            if host is not None:
                return host
            if not self._warned:
                self._warned = True
                log.warning("vstack pinned host: %s; falling back to torch's pinned allocator (buffers rounded up "
                            "to a power of two)", why)  # fmt: skip
        return self.torch.empty(size, dtype=self.torch.uint8, device="cpu", pin_memory=True)
