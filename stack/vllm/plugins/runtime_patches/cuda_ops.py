"""GPU: the device operations of the runtime patch `gpu-sleep-wake-at-bus-speed` (fast_sleep_wake.py): vLLM's
own map and unmap (its C extension's cuMemCreate/cuMemMap), cudaMemcpyAsync on one side stream, pinned host
buffers of the exact size. Imported on the GPU only (torch.cuda, vLLM's cumem)."""

from __future__ import annotations

from typing import Any


class CudaOps:
    """The allocator's own map/unmap (vLLM's C extension) and cudaMemcpyAsync on a side stream."""

    H2D, D2H = 1, 2  # cudaMemcpyKind

    def __init__(self) -> None:
        import ctypes

        import torch
        from vllm.device_allocator import cumem

        self.cumem, self.torch = cumem, torch
        fn = cumem.libcudart.lib.cudaMemcpyAsync
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        self.copy = fn
        self.stream = torch.cuda.Stream()
        self.pinned: Any = None

    def map(self, handle: Any) -> None:
        self.cumem.create_and_map(handle)

    def unmap(self, handle: Any) -> None:
        self.cumem.unmap_and_release(handle)

    def host_buffer(self, size: int) -> Any:
        from vllm.utils.platform_utils import is_pin_memory_available

        if not is_pin_memory_available():  # WSL: no page-locked memory; copies still work, slower
            return self.torch.empty(size, dtype=self.torch.uint8, device="cpu")
        if self.pinned is None:
            from stack.vllm.plugins.runtime_patches.pinned_host import PinnedHost

            self.pinned = PinnedHost(self.torch)
        return self.pinned.buffer(size)  # exact size, pinned on several threads (not torch's power of two)

    def _copy(self, dst: int, src: int, size: int, kind: int) -> None:
        err = self.copy(dst, src, size, kind, self.stream.cuda_stream)
        if err:
            raise RuntimeError(f"cudaMemcpyAsync failed with CUDA error {err}")

    def to_host(self, dst: int, src: int, size: int) -> None:
        self._copy(dst, src, size, self.D2H)

    def to_device(self, dst: int, src: int, size: int) -> None:
        self._copy(dst, src, size, self.H2D)

    def wait(self) -> None:
        self.stream.synchronize()

    def fence(self) -> None:
        """torch's current stream waits, on the GPU, for the copies issued so far (no host wait)."""
        self.torch.cuda.current_stream().wait_stream(self.stream)

    def collect(self) -> None:
        import gc

        gc.collect()
        self.torch.cuda.empty_cache()
