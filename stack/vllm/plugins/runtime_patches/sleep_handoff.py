"""The engine's side of the sleep-mode memory handoff (adr/0016; manager.sleep_handoff, on for one-GPU engines).

With VSTACK_SLEEP_HANDOFF_SOCKET set (the manager's broker, stack.vllm.plugins.handoff), the runtime patch
`gpu-sleep-wake-at-bus-speed` maps each allocation on wake from exportable pieces (512/32/2 MiB, back to back
in the allocation's reserved range) instead of vLLM's one non-exportable handle: pieces another engine handed
over first, fresh ones for the rest. Its next sleep hands every piece to the broker before releasing it, so
the next engine maps that memory without the driver clearing it: a piece it created, exported; a piece it was
handed, by the descriptor it came with (the driver refuses to export an imported handle: CUDA error 1 on the
H200, 2026-11-24), so memory goes back and forth between engines switch after switch. Pieces that came from
another engine are zeroed (an async memset, at memory speed) where no host copy overwrites them, the KV
cache: what vLLM gets from the driver, and nothing of the other model's data.

Memory vLLM created itself (before the first sleep) is released as upstream does. Before vLLM frees or
discards an allocation mapped from pieces, the pieces go and one handle of vLLM's own is mapped in their
place: its C extension then unmaps and releases what it expects.
"""

from __future__ import annotations

import logging
import os
from collections import Counter, defaultdict
from typing import Any, Protocol

from stack.vllm.plugins.handoff import cover, put_pieces, take_pieces
from stack.vllm.plugins.runtime_patches.cuda_vmm import CudaError

log = logging.getLogger("vllm.vstack_patches.sleep")


class Vmm(Protocol):
    """stack.vllm.plugins.runtime_patches.cuda_vmm.Driver's calls used here (tests bring a host-memory stand-in)."""

    def create(self, size: int) -> int: ...
    def map(self, ptr: int, size: int, handle: int) -> None: ...
    def unmap(self, ptr: int, size: int) -> None: ...
    def release(self, handle: int) -> None: ...
    def export(self, handle: int) -> int: ...
    def import_fd(self, fd: int) -> int: ...
    def zero(self, ptr: int, size: int, stream: int = 0) -> None: ...


class HandoffOps:
    """fast_sleep_wake's device operations with maps through exportable pieces; copies are the base's."""

    def __init__(self, base: Any, vmm: Vmm, path: str, device_id: str, stream: int = 0) -> None:
        self.base, self.vmm, self.path, self.device_id, self.stream = base, vmm, path, device_id, stream
        # d_mem -> [(offset, size, handle, descriptor it was handed with, or -1 if created here)]
        self.ours: dict[int, list[tuple[int, int, int, int]]] = {}
        self.reused: set[int] = set()  # allocations holding a piece another engine wrote to
        self.stock: dict[int, list[int]] = defaultdict(list)  # size -> descriptors taken for this wake
        self.outgoing: list[tuple[int, int]] = []  # (size, descriptor) this sleep hands on
        self.stats: Counter[str] = Counter()

    # -- copies: the base's ----------------------------------------------------------------------------
    def host_buffer(self, size: int) -> Any:
        return self.base.host_buffer(size)

    def to_host(self, dst: int, src: int, size: int) -> None:
        self.base.to_host(dst, src, size)

    def to_device(self, dst: int, src: int, size: int) -> None:
        self.base.to_device(dst, src, size)

    def wait(self) -> None:
        self.base.wait()

    def fence(self) -> None:
        self.base.fence()

    def collect(self) -> None:
        self.base.collect()

    # -- wake ------------------------------------------------------------------------------------------
    def before_wake(self, sizes: list[int], final: bool) -> None:
        """Take the pieces `sizes` want; `final`: the switch's last wake (handoff.take_pieces)."""
        want = Counter(p for size in sizes for p in cover(size) or [])
        for size, fd in take_pieces(self.path, self.device_id, dict(want), final):
            self.stock[size].append(fd)

    def map(self, handle: Any) -> None:
        _device, size, d_mem, _p = handle
        pieces = cover(size)
        if pieces is None:
            self.base.map(handle)
            return
        done: list[tuple[int, int, int, int]] = []
        reused = False
        try:
            offset = 0
            for piece in pieces:
                h, fd, handed = self._piece(piece)
                try:
                    self.vmm.map(d_mem + offset, piece, h)
                except CudaError:
                    self._drop(h, fd)
                    raise
                done.append((offset, piece, h, fd))
                reused |= handed
                offset += piece
        except CudaError as exc:
            for offset, piece, h, fd in done:
                self.vmm.unmap(d_mem + offset, piece)
                self._drop(h, fd)
            log.warning("vstack wake: pieces could not be mapped (%s); vLLM's own allocation instead", exc)
            self.stats["fallback"] += 1
            self.base.map(handle)
            return
        self.ours[d_mem] = done
        (self.reused.add if reused else self.reused.discard)(d_mem)

    def _piece(self, size: int) -> tuple[int, int, bool]:
        """(handle, its descriptor or -1, whether another engine handed it over): handed-over if one imports, else
        created here and exported at once. The sleep that hands it on then has nothing to export: the first switch
        after a start exported the 673 pieces its warm hand-over's wake had created (0.07 s of a 0.21 s switch
        whose steady median was 0.12 s, H200, 2026-11-30); the export now happens in that wake, off the switch."""
        while self.stock.get(size):
            fd = self.stock[size].pop()
            try:
                handle = self.vmm.import_fd(fd)
            except CudaError as exc:  # that piece is freed when its descriptor closes
                log.warning("vstack wake: a handed-over piece did not import (%s)", exc)
                os.close(fd)
                continue
            self.stats["imported"] += size
            return handle, fd, True  # kept open: the next sleep hands the piece on by it
        self.stats["created"] += size
        handle = self.vmm.create(size)
        try:
            return handle, self.vmm.export(handle), False
        except CudaError:  # exported (or released) at its sleep instead, as before
            return handle, -1, False

    def _drop(self, handle: int, fd: int) -> None:
        self.vmm.release(handle)
        if fd >= 0:
            os.close(fd)

    def zero_if_reused(self, ptr: int, size: int) -> None:
        """An allocation nothing is copied into (the KV cache): zero it if another engine's data is in it."""
        if ptr in self.reused:
            self.vmm.zero(ptr, size, self.stream)

    def after_wake(self) -> dict[str, int]:
        left = [fd for fds in self.stock.values() for fd in fds]
        for fd in left:
            os.close(fd)  # pieces this wake did not need: freed
        self.stock.clear()
        done = {k: self.stats.pop(k, 0) for k in ("imported", "created", "fallback")} | {"left": len(left)}
        log.info("vstack wake: %.2f GiB mapped from pieces another engine handed over, %.2f GiB created, %d pieces"
                 " left over, %d allocations vLLM's own (pieces failed)", done["imported"] / 2**30,
                 done["created"] / 2**30, done["left"], done["fallback"])  # fmt: skip
        return done

    # -- sleep -----------------------------------------------------------------------------------------
    def unmap(self, handle: Any) -> None:
        d_mem = handle[2]
        pieces = self.ours.pop(d_mem, None)
        if pieces is None:
            self.base.unmap(handle)  # vLLM's own allocation (before the first wake): released as upstream
            return
        self.reused.discard(d_mem)
        for offset, size, h, fd in pieces:
            self.vmm.unmap(d_mem + offset, size)
            try:
                self.outgoing.append((size, fd if fd >= 0 else self.vmm.export(h)))
            except CudaError as exc:
                log.warning("vstack sleep: a piece could not be exported (%s); released", exc)
            finally:
                self.vmm.release(h)  # the descriptor keeps the memory alive, nothing else does

    def after_sleep(self) -> dict[str, int]:
        out, self.outgoing = self.outgoing, []
        kept = put_pieces(self.path, self.device_id, out) if out else False
        for _size, fd in out:
            os.close(fd)  # the broker holds its own copies where it kept them; else the memory is freed here
        return {"handed": sum(s for s, _ in out) if kept else 0, "pieces": len(out)}

    # -- vLLM freeing or discarding an allocation ------------------------------------------------------
    def restore_for_free(self, handle: Any) -> None:
        """Before vLLM's C extension unmaps and releases `handle`: map a handle of its own in our pieces' place."""
        d_mem = handle[2]
        pieces = self.ours.pop(d_mem, None)
        if pieces is None:
            return
        self.reused.discard(d_mem)
        for offset, size, h, fd in pieces:
            self.vmm.unmap(d_mem + offset, size)
            self._drop(h, fd)
        self.base.map(handle)
