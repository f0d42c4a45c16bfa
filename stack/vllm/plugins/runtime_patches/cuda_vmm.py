"""CUDA's virtual memory driver calls the sleep-mode memory handoff needs (ctypes on libcuda; adr/0016).

vLLM's own C extension creates allocations that cannot be exported; these create exportable ones (POSIX file
descriptors), export and import them, and map several of them back to back into one reserved range. Used by
stack.vllm.plugins.runtime_patches.sleep_handoff inside a GPU engine and by bench/gpu/handoff_probe.py on its own.
"""

from __future__ import annotations

import ctypes

POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
LOCATION_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
READ_WRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]  # fmt: skip


class AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocFlags)]  # fmt: skip


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


class CudaError(RuntimeError):
    pass


class Driver:
    """Exportable VMM allocations on one device. `own_context`: a process of its own (the probe) makes the
    device's primary context current; inside vLLM the engine's thread already has it."""

    def __init__(self, device: int = 0, own_context: bool = False) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise CudaError(f"no NVIDIA driver here ({exc})") from exc
        self.device = device
        if own_context:
            self.check("cuInit", 0)
            dev, ctx = ctypes.c_int(), ctypes.c_void_p()
            self.check("cuDeviceGet", ctypes.byref(dev), device)
            self.check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
            self.check("cuCtxSetCurrent", ctx)
        self.prop = AllocationProp(type=PINNED, requestedHandleTypes=POSIX_FD,
                                   location=Location(LOCATION_DEVICE, device))  # fmt: skip
        gran = ctypes.c_size_t()
        self.check("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(self.prop), 0)
        self.granularity = gran.value

    def check(self, name: str, *args: object) -> None:
        code = getattr(self.lib, name)(*args)
        if code != 0:
            raise CudaError(f"{name} failed with CUDA error {code}")

    def create(self, size: int) -> int:
        handle = ctypes.c_ulonglong()
        self.check("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(self.prop),
                   ctypes.c_ulonglong(0))  # fmt: skip
        return handle.value

    def reserve(self, size: int) -> int:
        ptr = ctypes.c_ulonglong()
        self.check("cuMemAddressReserve", ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
                   ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))  # fmt: skip
        return ptr.value

    def map(self, ptr: int, size: int, handle: int) -> None:
        """Map `handle` whole at `ptr` and give this device read/write access to it."""
        self.check("cuMemMap", ctypes.c_ulonglong(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
                   ctypes.c_ulonglong(handle), ctypes.c_ulonglong(0))  # fmt: skip
        desc = AccessDesc(Location(LOCATION_DEVICE, self.device), READ_WRITE)
        try:
            self.check("cuMemSetAccess", ctypes.c_ulonglong(ptr), ctypes.c_size_t(size), ctypes.byref(desc),
                       ctypes.c_size_t(1))  # fmt: skip
        except CudaError:
            self.unmap(ptr, size)
            raise

    def unmap(self, ptr: int, size: int) -> None:
        self.check("cuMemUnmap", ctypes.c_ulonglong(ptr), ctypes.c_size_t(size))

    def release(self, handle: int) -> None:
        self.check("cuMemRelease", ctypes.c_ulonglong(handle))

    def export(self, handle: int) -> int:
        fd = ctypes.c_int()
        self.check("cuMemExportToShareableHandle", ctypes.byref(fd), ctypes.c_ulonglong(handle), POSIX_FD,
                   ctypes.c_ulonglong(0))  # fmt: skip
        return fd.value

    def import_fd(self, fd: int) -> int:
        handle = ctypes.c_ulonglong()
        self.check("cuMemImportFromShareableHandle", ctypes.byref(handle), ctypes.c_void_p(fd), POSIX_FD)
        return handle.value

    def zero(self, ptr: int, size: int, stream: int = 0) -> None:
        """Queue a memset to 0 on `stream` (a cudaStream_t / CUstream value)."""
        self.check("cuMemsetD8Async", ctypes.c_ulonglong(ptr), ctypes.c_ubyte(0), ctypes.c_size_t(size),
                   ctypes.c_void_p(stream))  # fmt: skip

    def memset(self, ptr: int, size: int, value: int = 7) -> None:
        self.check("cuMemsetD8_v2", ctypes.c_ulonglong(ptr), ctypes.c_ubyte(value), ctypes.c_size_t(size))

    def sync(self) -> None:
        self.check("cuCtxSynchronize")

    def host_pinned(self, size: int) -> int:
        ptr = ctypes.c_void_p()
        self.check("cuMemHostAlloc", ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_uint(0))
        return ptr.value

    def copy_in(self, dst: int, src: int, size: int) -> None:
        self.check("cuMemcpyHtoD_v2", ctypes.c_ulonglong(dst), ctypes.c_void_p(src), ctypes.c_size_t(size))
