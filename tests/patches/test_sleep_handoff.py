"""The sleep-mode memory handoff's bookkeeping (stack/vllm/plugins/runtime_patches/sleep_handoff.py) between
two engines.

No GPU here: `FakeVmm` stands in for CUDA's virtual memory API over `HostDevice` buffers (the allocations'
fixed addresses, from test_fast_sleep_wake): a handle is a block of "physical" bytes that survives unmapping,
an exported handle is a real memfd descriptor that travels through the real broker (stack.vllm.plugins.handoff)
and imports as the same block. Fresh blocks are zeroed, as the driver's are. The GPU path: bench/gpu/handoff_probe.py
and bash bench/gpu/switch_time.sh pair.
"""

from __future__ import annotations

import ctypes
import os
from types import SimpleNamespace

import pytest
from vllm.device_allocator import AllocationData

from stack.vllm.plugins.handoff import HandoffBroker
from stack.vllm.plugins.runtime_patches import fast_sleep_wake as fsw
from stack.vllm.plugins.runtime_patches.cuda_vmm import CudaError
from stack.vllm.plugins.runtime_patches.sleep_handoff import HandoffOps
from tests.patches.test_fast_sleep_wake import HostDevice

MIB = 1024**2


class FakeVmm:
    """One GPU's physical memory shared by every engine in the test."""

    def __init__(self, *devices: HostDevice) -> None:
        self.devices = devices
        self.blocks: dict[int, bytearray] = {}
        self.handles: dict[int, int] = {}  # handle -> block
        self.by_inode: dict[int, int] = {}  # exported descriptor's inode -> block
        self.imported: set[int] = set()  # handles from import_fd: the driver refuses to export those
        self.mapped: dict[int, int] = {}  # address -> handle
        self.zeroed = 0
        self.exports = 0
        self._next = 1
        self.capacity: int | None = None  # bytes the "GPU" holds: create fails past it, as cuMemCreate does

    def live(self) -> int:
        """Bytes held: blocks a handle or an open descriptor (the broker's, an engine's) still refers to."""
        inodes = set()
        for name in os.listdir("/proc/self/fd"):
            try:
                inodes.add(os.fstat(int(name)).st_ino)
            except OSError:
                continue
        held = set(self.handles.values()) | {b for ino, b in self.by_inode.items() if ino in inodes}
        return sum(len(self.blocks[b]) for b in held)

    def _new(self, block: int) -> int:
        self._next += 1
        self.handles[self._next] = block
        return self._next

    def _device(self, ptr: int) -> HostDevice | None:
        return next((d for d in self.devices if ptr in d.buffers), None)

    def create(self, size: int) -> int:
        if self.capacity is not None and self.live() + size > self.capacity:
            raise CudaError("cuMemCreate failed with CUDA error 2")  # out of memory
        block = len(self.blocks) + 1
        self.blocks[block] = bytearray(size)  # cleared by the driver
        return self._new(block)

    def map(self, ptr: int, size: int, handle: int) -> None:
        assert ptr not in self.mapped and len(self.blocks[self.handles[handle]]) == size
        ctypes.memmove(ptr, bytes(self.blocks[self.handles[handle]]), size)
        self.mapped[ptr] = handle
        dev = self._device(ptr)
        if dev is not None:  # the allocation's first piece: the address range is usable again
            dev.mapped.add(ptr)

    def unmap(self, ptr: int, size: int) -> None:
        handle = self.mapped.pop(ptr)
        self.blocks[self.handles[handle]][:] = ctypes.string_at(ptr, size)  # the memory keeps what was written
        ctypes.memset(ptr, 0xDD, size)
        dev = self._device(ptr)
        if dev is not None:
            dev.mapped.discard(ptr)

    def release(self, handle: int) -> None:
        del self.handles[handle]

    def export(self, handle: int) -> int:
        if handle in self.imported:  # as the driver answered on the H200 (suite run, 2026-11-24)
            raise CudaError("cuMemExportToShareableHandle failed with CUDA error 1")
        self.exports += 1
        fd = os.memfd_create("piece")
        self.by_inode[os.fstat(fd).st_ino] = self.handles[handle]
        return fd

    def import_fd(self, fd: int) -> int:
        handle = self._new(self.by_inode[os.fstat(fd).st_ino])
        self.imported.add(handle)
        return handle

    def zero(self, ptr: int, size: int, stream: int = 0) -> None:
        ctypes.memset(ptr, 0, size)
        self.zeroed += size


def engine(dev: HostDevice, sizes: list[tuple[str, int]], fill: int) -> SimpleNamespace:
    table = {}
    for i, (tag, size) in enumerate(sizes):
        ptr = dev.allocate(size, fill=fill + i)
        table[ptr] = AllocationData((0, size, ptr, 1000 + i), tag)
    return SimpleNamespace(pointer_to_data=table, default_tag="default")


def tagged(alloc, tag: str) -> dict[int, bytes]:
    return {p: ctypes.string_at(p, d.handle[1]) for p, d in alloc.pointer_to_data.items() if d.tag == tag}


@pytest.fixture
def gpu():
    broker = HandoffBroker().start()  # in the system temp folder, as the stack: a tmp_path can be too long
    dev_a, dev_b = HostDevice(), HostDevice()
    vmm = FakeVmm(dev_a, dev_b)
    a = engine(dev_a, [("weights", 34 * MIB), ("weights", 4 * MIB), ("kv_cache", 64 * MIB)], fill=1)
    b = engine(dev_b, [("weights", 6 * MIB), ("kv_cache", 66 * MIB)], fill=0x51)
    ops_a = HandoffOps(dev_a, vmm, broker.path, "gpu-0")
    ops_b = HandoffOps(dev_b, vmm, broker.path, "gpu-0")
    try:
        yield SimpleNamespace(broker=broker, vmm=vmm, a=a, b=b, ops_a=ops_a, ops_b=ops_b, dev_b=dev_b)
    finally:
        broker.stop()


def test_b_wakes_in_the_memory_a_handed_over_with_its_weights_exact_and_its_kv_cache_zeroed(gpu) -> None:
    weights_a, weights_b = tagged(gpu.a, "weights"), tagged(gpu.b, "weights")
    # Both engines slept once (vLLM's own memory, released as upstream does); B stays asleep.
    fsw.sleep(gpu.a, ("weights",), gpu.ops_a, keep=True)
    fsw.sleep(gpu.b, ("weights",), gpu.ops_b, keep=True)
    woke = fsw.wake_up(gpu.a, None, gpu.ops_a, keep=True)  # nothing handed over yet: fresh pieces
    assert woke["handoff_imported"] == 0 and woke["handoff_created"] == 102 * MIB
    assert tagged(gpu.a, "weights") == weights_a

    gpu.broker.open_window("gpu-0")  # the manager: a switch A -> B begins
    slept = fsw.sleep(gpu.a, ("weights",), gpu.ops_a, keep=True)
    assert slept["copied"] == 0 and slept["handoff_handed"] == 102 * MIB  # release-only, memory kept
    assert gpu.broker.held_bytes("gpu-0") == 102 * MIB

    woke = fsw.wake_up(gpu.b, None, gpu.ops_b, keep=True)
    # A left 3 x 32 + 3 x 2 MiB pieces; B's 6 + 66 MiB want 2 x 32 + 4 x 2: one 2 MiB piece is created fresh.
    assert woke["handoff_imported"] == 70 * MIB and woke["handoff_created"] == 2 * MIB
    assert tagged(gpu.b, "weights") == weights_b  # the host copy overwrote A's bytes
    assert all(v == b"\0" * len(v) for v in tagged(gpu.b, "kv_cache").values())  # A's data is not readable in B
    assert gpu.vmm.zeroed == 66 * MIB
    # What B could not map (a 32 MiB piece) was freed before B created its 2 MiB: the window ends with nothing.
    assert gpu.broker.held_bytes() == 0 and gpu.broker.stats["dropped"] == 1
    assert gpu.broker.close_window() == 0


def test_pieces_a_wake_creates_are_exported_in_that_wake_so_the_sleep_that_hands_them_on_exports_none(gpu) -> None:
    """The first switch after a start: the warm hand-over's wake created every piece (nothing was handed over);
    the switch's sleep hands them on without exporting one (the H200 spent 0.07 s exporting 673 in that sleep)."""
    fsw.sleep(gpu.b, ("weights",), gpu.ops_b, keep=True)  # B asleep, A's wake off the switch
    fsw.sleep(gpu.a, ("weights",), gpu.ops_a, keep=True)
    woke = fsw.wake_up(gpu.a, None, gpu.ops_a, keep=True)  # off the switch: the warm hand-over
    pieces = sum(len(v) for v in gpu.ops_a.ours.values())
    assert woke["handoff_created"] == 102 * MIB and gpu.vmm.exports == pieces
    gpu.broker.open_window("gpu-0")  # the first switch
    slept = fsw.sleep(gpu.a, ("weights",), gpu.ops_a, keep=True)
    assert slept["handoff_handed"] == 102 * MIB and gpu.vmm.exports == pieces  # none in the switch's sleep
    woke = fsw.wake_up(gpu.b, None, gpu.ops_b, keep=True)
    assert woke["handoff_imported"] == 70 * MIB
    assert gpu.vmm.zeroed == 66 * MIB  # the pieces A created and handed on still count as another engine's data
    gpu.broker.close_window()


def test_outside_a_window_a_sleep_frees_its_memory(gpu) -> None:
    fsw.sleep(gpu.a, ("weights",), gpu.ops_a, keep=True)
    fsw.wake_up(gpu.a, None, gpu.ops_a, keep=True)
    slept = fsw.sleep(gpu.a, ("weights",), gpu.ops_a, keep=True)  # e.g. an idle sleep: no switch waits
    assert slept["handoff_handed"] == 0 and slept["handoff_pieces"] > 0 and gpu.broker.held_bytes() == 0
    woke = fsw.wake_up(gpu.a, None, gpu.ops_a, keep=True)
    assert woke["handoff_imported"] == 0


def test_vllm_freeing_an_allocation_mapped_from_pieces_gets_its_own_handle_back(gpu) -> None:
    fsw.sleep(gpu.b, ("weights",), gpu.ops_b, keep=True)
    fsw.wake_up(gpu.b, None, gpu.ops_b, keep=True)
    ptr, data = next(iter(gpu.b.pointer_to_data.items()))
    assert ptr in gpu.ops_b.ours and ptr in gpu.vmm.mapped
    gpu.ops_b.restore_for_free(data.handle)  # what the patched free callback does before vLLM's C unmaps
    assert ptr not in gpu.ops_b.ours and ptr not in gpu.vmm.mapped and ptr in gpu.dev_b.mapped  # vLLM's map


def test_memory_goes_back_and_forth_switch_after_switch(gpu, caplog) -> None:
    """B hands back what A handed it: by the descriptors it received (an imported handle cannot be exported)."""
    for alloc, ops in ((gpu.a, gpu.ops_a), (gpu.b, gpu.ops_b)):
        fsw.sleep(alloc, ("weights",), ops, keep=True)
    fsw.wake_up(gpu.a, None, gpu.ops_a, keep=True)
    weights_a = tagged(gpu.a, "weights")
    for _round in range(2):
        gpu.broker.open_window("gpu-0")  # A -> B
        assert fsw.sleep(gpu.a, ("weights",), gpu.ops_a, keep=True)["handoff_handed"] == 102 * MIB
        fsw.wake_up(gpu.b, None, gpu.ops_b, keep=True)
        gpu.broker.close_window()
        gpu.broker.open_window("gpu-0")  # B -> A: every piece of B's goes back, the imported ones included
        slept = fsw.sleep(gpu.b, ("weights",), gpu.ops_b, keep=True)
        assert slept["handoff_handed"] == 72 * MIB
        woke = fsw.wake_up(gpu.a, None, gpu.ops_a, keep=True)
        # B's 2 x 32 + 4 x 2 MiB; A's 34 + 4 + 64 MiB take 2 x 32 + 3 x 2 of them and one 32 MiB piece fresh.
        assert woke["handoff_imported"] == 70 * MIB and woke["handoff_created"] == 32 * MIB
        assert tagged(gpu.a, "weights") == weights_a
        gpu.broker.close_window()
    assert "could not be exported" not in caplog.text
    assert gpu.broker.held_bytes() == 0


class _Allocator:
    _vstack_sleeps = 0


def _worker(allocator: _Allocator, sleeps: bool, message: str = fsw.GREW):
    """vLLM's Worker.sleep in outline: the allocator's sleep (counted as the patch counts it), then the check."""

    class Worker:
        def sleep(self, level: int = 1) -> None:
            if sleeps:
                allocator._vstack_sleeps += 1
            raise AssertionError(message)

    return Worker


def test_the_free_memory_check_is_skipped_only_for_a_sleep_that_completed() -> None:
    """adr/0035: beside another engine's wake the device's free memory falls while a handing-over sleep runs."""
    allocator = _Allocator()
    done = _worker(allocator, sleeps=True)
    done.sleep = fsw._sleep_check_beside_a_wake(done.sleep, lambda: allocator)
    assert done().sleep(1) is None and allocator._vstack_sleeps == 1
    failed = _worker(allocator, sleeps=False)  # the allocator's sleep did not complete: the check stands
    failed.sleep = fsw._sleep_check_beside_a_wake(failed.sleep, lambda: allocator)
    with pytest.raises(AssertionError, match="increased"):
        failed().sleep(1)
    other = _worker(allocator, sleeps=True, message="something else")  # another assertion: not ours to skip
    other.sleep = fsw._sleep_check_beside_a_wake(other.sleep, lambda: allocator)
    with pytest.raises(AssertionError, match="something else"):
        other().sleep(1)


def test_a_sleep_that_keeps_its_weights_mapped_hands_over_only_its_kv_cache(gpu) -> None:
    """manager.sleep_keeps_weights (adr/0058) with the handoff: A's weights stay mapped in their pieces (bytes
    intact), its 64 MiB KV cache goes to the broker, B's KV cache wakes in it; A's wake then maps its KV cache
    alone and takes nothing for its weights."""
    for alloc, ops in ((gpu.a, gpu.ops_a), (gpu.b, gpu.ops_b)):
        fsw.sleep(alloc, ("weights",), ops, keep=True)
    fsw.wake_up(gpu.a, None, gpu.ops_a, keep=True)
    weights_a = tagged(gpu.a, "weights")
    gpu.broker.open_window("gpu-0")  # A -> B, A keeping its weights
    gpu.a._vstack_keep_mapped = True
    slept = fsw.sleep(gpu.a, ("weights",), gpu.ops_a, keep=True)
    assert slept["handoff_handed"] == 64 * MIB and slept["discarded"] == 64 * MIB and slept["copied"] == 0
    assert tagged(gpu.a, "weights") == weights_a  # still mapped, readable, untouched
    fsw.wake_up(gpu.b, ["weights"], gpu.ops_b, keep=True)
    woke = fsw.wake_up(gpu.b, ["kv_cache"], gpu.ops_b, keep=True)
    assert woke["handoff_imported"] == 64 * MIB  # A's KV cache
    gpu.broker.close_window()
    gpu.broker.open_window("gpu-0")  # B -> A
    fsw.sleep(gpu.b, ("weights",), gpu.ops_b, keep=True)
    woke_weights = fsw.wake_up(gpu.a, ["weights"], gpu.ops_a, keep=True)
    assert woke_weights["mapped"] == 0 and woke_weights["moved"] == 0  # nothing to map or copy
    woke = fsw.wake_up(gpu.a, ["kv_cache"], gpu.ops_a, keep=True)
    assert woke["mapped"] == 64 * MIB and tagged(gpu.a, "weights") == weights_a
    gpu.broker.close_window()


def test_a_wake_short_of_pieces_frees_the_ones_it_cannot_map_before_it_creates_memory() -> None:
    """The trio on the H200 (2026-11-30): an 8B released its kept weights (986 pieces, mostly 2 MiB) for a 7B's
    KV cache, which wants 512 and 32 MiB pieces; the 2 MiB ones stayed in the broker, held their memory, and the
    7B's wake ran out of it (cold start instead). The switch's last wake now has the broker free what it cannot
    give before the wake creates memory; a weights-only wake (another follows) leaves them."""
    broker = HandoffBroker().start()
    dev_r, dev_t = HostDevice(), HostDevice()
    vmm = FakeVmm(dev_r, dev_t)
    released = engine(dev_r, [("weights", 6 * MIB)] * 4 + [("weights", 32 * MIB)], fill=3)  # 12 x 2 + 1 x 32
    target = engine(dev_t, [("weights", 64 * MIB), ("kv_cache", 64 * MIB)], fill=0x33)  # 2 x 32 each
    ops_r, ops_t = HandoffOps(dev_r, vmm, broker.path, "gpu-0"), HandoffOps(dev_t, vmm, broker.path, "gpu-0")
    try:
        weights_t = tagged(target, "weights")
        fsw.sleep(released, ("weights",), ops_r, keep=True)
        fsw.sleep(target, ("weights",), ops_t, keep=True)
        fsw.wake_up(released, None, ops_r, keep=True)
        broker.open_window("gpu-0")
        assert fsw.sleep(released, ("weights",), ops_r, keep=True)["handoff_handed"] == 56 * MIB
        woke = fsw.wake_up(target, ["weights"], ops_t, keep=True)
        assert woke["handoff_imported"] == 32 * MIB and woke["handoff_created"] == 32 * MIB
        assert broker.held_bytes("gpu-0") == 24 * MIB  # another wake follows: its pieces may still serve
        vmm.capacity = vmm.live() + 40 * MIB  # the KV cache's 64 MiB fit only once those 24 MiB are freed
        woke = fsw.wake_up(target, ["kv_cache"], ops_t, keep=True)
        assert woke["handoff_fallback"] == 0 and woke["handoff_created"] == 64 * MIB
        assert broker.held_bytes() == 0 and broker.stats["dropped"] == 12
        assert tagged(target, "weights") == weights_t
        assert all(v == b"\0" * len(v) for v in tagged(target, "kv_cache").values())
    finally:
        broker.stop()
