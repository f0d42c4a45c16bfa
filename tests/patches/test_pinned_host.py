"""The sleep patch's host buffers (stack/vllm/plugins/runtime_patches/pinned_host.py) on this CPU.

`cudaHostRegister` needs a GPU: here a recorder stands in for it (and for its failure). What runs for real is the
rest: the buffer is an anonymous mapping of exactly the size asked (torch's pinned allocator would round it up to
a power of two), every page is populated before the registration (on several threads), the registration covers
the buffer's own address and size, it is undone once the tensor is gone, and a failed registration falls back
to a buffer that still works. The pinning speed is measured on the GPU by `bash bench/gpu/run.sh pinned_probe`.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import logging
import mmap

import pytest
import torch

from stack.vllm.plugins.runtime_patches import pinned_host as ph

MIB = 1 << 20


class Cuda:
    """Records registrations as cudaHostRegister/cudaHostUnregister would see them."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.registered: dict[int, int] = {}
        self.unregistered: list[int] = []

    def register(self, address: int, size: int) -> int:
        if self.fail:
            return 1  # cudaErrorInvalidValue
        self.registered[address] = size
        return 0

    def unregister(self, address: int) -> None:
        self.unregistered.append(address)


def resident_pages(tensor: torch.Tensor) -> int:
    """How many of the tensor's pages are in memory (mincore), read through the buffer's own mapping."""
    import ctypes

    libc = ctypes.CDLL(None)
    page = mmap.PAGESIZE
    start = tensor.data_ptr() - tensor.data_ptr() % page
    pages = (tensor.data_ptr() + tensor.numel() - start + page - 1) // page
    vec = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * page), vec) == 0
    return sum(b & 1 for b in vec)


@pytest.mark.parametrize("size", [3 * MIB + 12345, 271 * MIB])
def test_a_buffer_is_the_size_asked_populated_then_registered_and_released_when_dropped(size: int) -> None:
    cuda = Cuda()
    buf = ph.registered_buffer(size, cuda.register, cuda.unregister, workers=2)
    assert buf is not None and buf.dtype == torch.uint8 and buf.numel() == size  # not 4 MiB, not 512 MiB
    assert cuda.registered == {buf.data_ptr(): size}
    assert buf.data_ptr() % mmap.PAGESIZE == 0  # its own mapping
    assert resident_pages(buf) * mmap.PAGESIZE >= size  # populated before registering: pinned pages are resident
    assert int(buf[:4096].sum()) == 0 and int(buf[-4096:].sum()) == 0
    buf[-1] = 7
    assert int(buf[-1]) == 7
    address = buf.data_ptr()
    assert cuda.unregistered == []
    del buf
    gc.collect()
    assert cuda.unregistered == [address]


def test_a_view_keeps_the_buffer_registered_until_it_goes_too() -> None:
    cuda = Cuda()
    buf = ph.registered_buffer(2 * MIB, cuda.register, cuda.unregister, workers=1)
    tail = buf[-16:]  # the sleep patch's spot check reads such views of a kept copy
    tail.fill_(5)
    del buf
    gc.collect()
    assert cuda.unregistered == [] and tail.tolist() == [5] * 16  # still pinned and mapped for the view
    del tail
    gc.collect()
    assert len(cuda.unregistered) == 1


def test_a_failed_registration_gives_no_buffer_and_releases_its_memory() -> None:
    cuda = Cuda(fail=True)
    assert ph.registered_buffer(64 * MIB, cuda.register, cuda.unregister, workers=2) is None
    gc.collect()
    assert cuda.registered == {} and cuda.unregistered == []


def test_populate_covers_every_page_with_several_threads_and_with_one() -> None:
    for workers in (1, 4):
        area = mmap.mmap(-1, 130 * MIB + 5, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        view = torch.frombuffer(area, dtype=torch.uint8)
        assert resident_pages(view) < view.numel() // mmap.PAGESIZE  # a fresh mapping is not resident
        ph.populate(view.data_ptr(), view.numel(), workers)
        assert resident_pages(view) * mmap.PAGESIZE >= view.numel()
        del view
        area.close()


def test_the_thread_count_follows_the_variable_else_the_cores(monkeypatch) -> None:
    monkeypatch.setenv(ph.THREADS_ENV, "3")
    assert ph.threads() == 3
    monkeypatch.setenv(ph.THREADS_ENV, "zero")
    assert 1 <= ph.threads() <= 16


class FakeCudart:
    """torch.cuda.cudart() as PinnedHost calls it; the failing one stands for a machine that cannot register."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.calls: list[str] = []

    def cudaHostRegister(self, address: int, size: int, flags: int) -> int:
        self.calls.append("register")
        return 1 if self.fail else 0

    def cudaHostUnregister(self, address: int) -> int:
        self.calls.append("unregister")
        return 0


@pytest.mark.parametrize("fail", [False, True])
def test_pinned_host_falls_back_to_torchs_pinned_allocator_once_registration_fails(monkeypatch, caplog, fail) -> None:
    cudart = FakeCudart(fail)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    pinned: list[int] = []
    real_empty = torch.empty

    def empty(*args, **kwargs):
        if kwargs.pop("pin_memory", False):  # no GPU here: torch cannot pin, so record the ask
            pinned.append(args[0])
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(ph.log, "disabled", False)  # an earlier test's logging.config may have silenced it
    host = ph.PinnedHost(torch, way="register")
    with caplog.at_level(logging.WARNING, logger=ph.log.name):
        bufs = [host.buffer(MIB), host.buffer(2 * MIB)]
    assert [b.numel() for b in bufs] == [MIB, 2 * MIB]
    assert cudart.calls == ["register", "register"]
    assert pinned == ([MIB, 2 * MIB] if fail else [])
    assert ("falling back to torch's pinned allocator" in caplog.text) is fail
    assert caplog.text.count("cudaHostRegister failed") == (1 if fail else 0)  # said once, not per buffer


def test_the_torch_way_is_vllms_own(monkeypatch) -> None:
    cudart = FakeCudart(False)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    asked: list[dict] = []
    real_empty = torch.empty
    monkeypatch.setattr(
        torch, "empty", lambda *a, **k: asked.append(dict(k)) or real_empty(*a, **{**k, "pin_memory": False})
    )
    monkeypatch.setenv(ph.WAY_ENV, "torch")
    ph.PinnedHost(torch).buffer(MIB)
    assert cudart.calls == [] and asked[0]["pin_memory"] is True


class Madvise:
    """The kernel's answer to MADV_POPULATE_WRITE, chosen: EINVAL (a kernel before 5.14) or ENOMEM."""

    def __init__(self, err: int) -> None:
        self.err = err

    def madvise(self, address: int, size: int, advice: int) -> int:
        if advice != ph.MADV_POPULATE_WRITE:
            return 0
        ctypes.set_errno(self.err)
        return -1


def test_an_old_kernel_gets_its_pages_written_and_no_memory_is_an_error_not_a_write(monkeypatch) -> None:
    area = mmap.mmap(-1, 8 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = torch.frombuffer(area, dtype=torch.uint8)
    monkeypatch.setattr(ph, "_libc", Madvise(errno.EINVAL))
    ph.populate(view.data_ptr(), view.numel(), 2)
    assert resident_pages(view) * mmap.PAGESIZE >= view.numel()
    monkeypatch.setattr(ph, "_libc", Madvise(errno.ENOMEM))
    with pytest.raises(OSError, match="populating host memory"):
        ph.populate(view.data_ptr(), view.numel(), 2)


def test_pinned_host_falls_back_when_the_memory_cannot_be_populated(monkeypatch, caplog) -> None:
    cudart = FakeCudart(False)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    monkeypatch.setattr(ph, "_libc", Madvise(errno.ENOMEM))
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **{**k, "pin_memory": False}))
    monkeypatch.setattr(ph.log, "disabled", False)
    with caplog.at_level(logging.WARNING, logger=ph.log.name):
        buf = ph.PinnedHost(torch, way="register").buffer(2 * MIB)
    assert buf.numel() == 2 * MIB and cudart.calls == []  # never registered: torch's buffer instead
    assert "populating host memory" in caplog.text and "falling back" in caplog.text
