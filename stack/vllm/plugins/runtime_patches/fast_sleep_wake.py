"""GPU: sleep and wake at the bus's speed (issue 14, patch ledger `gpu-sleep-wake-at-bus-speed`).

vLLM's `CuMemAllocator` (0.26-0.33) pays for two things a model switch does not need:

1. Every level-1 sleep allocates fresh pinned host buffers and copies every weight allocation into them
   with a synchronous `cudaMemcpy`, one allocation after the other, although weights do not change while
   an inference engine serves: from the second sleep on, the copy made at the first one is still exact.
   With VSTACK_SLEEP_KEEP_HOST_COPY=1 (the stack sets it only where weights cannot change: no LoRA slots,
   no KV scales computed at run time, no expert load balancing; stack.engine.sleep_copy) the copy is kept
   across wakes, and a later sleep only unmaps. Host memory is what vLLM holds anyway: torch's caching host
   allocator keeps the freed pinned blocks (vllm#16663). A spot check (first and last bytes of every
   allocation against the kept copy) recopies an allocation that changed anyway, and says so.
2. `wake_up` maps and copies each allocation synchronously in turn. Here each copy is issued
   asynchronously on a side stream right after its map, so the next maps (the KV cache's too, in a
   one-call wake) run under the copies; one synchronize ends the wake.

5. In an overlapped switch a weights-only wake returns once its copies are issued and the KV cache's wake maps
   under them (deferred_wake.py). The device operations themselves: cuda_ops.py.

Level 2 (nothing offloaded) drops the kept copies: level 2 is chosen where host RAM is short. The logs
say where the time went (`vstack sleep:` / `vstack wake:` lines in the engine log).

3. The first sleep paid for allocating the pinned host buffers (6.5 s of a 7.0 s first switch of an 8B on an
   H100, issue 37) where later ones reuse them. `stage` does that work in the background once the engine
   serves (the manager asks, `POST /collective_rpc {"method": "vstack_stage_host_copy"}`, for models that
   sleep to host RAM): the buffers are allocated and, where the copy may be kept, filled, so the first
   sleep finds what later ones find. A sleep that arrives meanwhile waits for the staging to end.
4. The host buffers themselves are the size of their allocation, pinned on several threads (pinned_host.py),
   not torch's pinned blocks rounded up to a power of two: a model alone (no staging) pays less at its first
   sleep (`vstack down`, adr/0030), and the host RAM an engine holds asleep is what the planner counts.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any, Protocol

from stack.vllm.plugins.handoff import SOCKET_ENV
from stack.vllm.plugins.host_copy import (
    KEEP_ENV,
    KEEP_WEIGHTS_METHOD,
    RELEASE_WEIGHTS_METHOD,
    STAGE_METHOD,
    STAGING_METHOD,
)
from stack.vllm.plugins.runtime_patches import deferred_wake
from stack.vllm.plugins.runtime_patches.cuda_ops import CudaOps

MARK = "_vstack_patch"
SPOT_BYTES = 4096  # bytes compared at each end of an allocation before a kept copy is reused
log = logging.getLogger("vllm.vstack_patches.sleep")
_busy = threading.Lock()  # staging, sleeping and waking never overlap: a sleep waits for a staging to end


class Ops(Protocol):
    """What the sleep and wake need from the device (CudaOps on the GPU; tests bring host memory)."""

    def map(self, handle: Any) -> None: ...
    def unmap(self, handle: Any) -> None: ...
    def host_buffer(self, size: int) -> Any: ...  # a uint8 torch tensor (pinned on the GPU)
    def to_host(self, dst: int, src: int, size: int) -> None: ...  # queued; done at wait()
    def to_device(self, dst: int, src: int, size: int) -> None: ...
    def wait(self) -> None: ...
    def collect(self) -> None: ...


def keep_enabled() -> bool:
    return os.environ.get(KEEP_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _tags(offload_tags: tuple[str, ...] | str | None, default: str) -> tuple[str, ...]:
    if offload_tags is None:
        return (default,)
    return (offload_tags,) if isinstance(offload_tags, str) else tuple(offload_tags)


def _spot_check(ops: Ops, reused: list[tuple[int, Any, Any]]) -> list[tuple[int, Any, Any]]:
    """The reused copies whose first or last bytes differ from the device's now (changed while awake)."""
    import torch

    ends = [min(SPOT_BYTES, data.handle[1]) for _ptr, data, _kept in reused]
    scratch = ops.host_buffer(2 * sum(ends))  # one buffer for every probe: pinned allocations are slow
    at, probes = 0, []
    for (ptr, data, kept), n in zip(reused, ends, strict=True):
        size = data.handle[1]
        ops.to_host(scratch.data_ptr() + at, ptr, n)
        ops.to_host(scratch.data_ptr() + at + n, ptr + size - n, n)
        probes.append((ptr, data, kept, at, n))
        at += 2 * n
    ops.wait()
    changed = []
    for ptr, data, kept, at, n in probes:
        size = data.handle[1]
        if not (
            torch.equal(scratch[at : at + n], kept[:n]) and torch.equal(scratch[at + n : at + 2 * n], kept[size - n :])
        ):
            changed.append((ptr, data, kept))
    return changed


def sleep(allocator: Any, offload_tags: tuple[str, ...] | str | None, ops: Ops, keep: bool) -> dict[str, float]:
    """vLLM's CuMemAllocator.sleep: offload the tagged allocations, discard the rest, release all."""
    deferred_wake.settle(allocator, ops, keep)  # a weights wake's copies still running: done before any unmap
    tags = _tags(offload_tags, allocator.default_tag)
    t0 = time.perf_counter()
    copied = discarded = 0
    # What is mapped: all of it, but for a release of weights an earlier sleep kept mapped (RELEASE_WEIGHTS_METHOD).
    items = [(p, d) for p, d in allocator.pointer_to_data.items() if not getattr(d, "is_asleep", False)]
    # KEEP_WEIGHTS_METHOD asked for this sleep only: the offloaded allocations (the weights) stay mapped, untouched.
    keep_mapped, allocator._vstack_keep_mapped = getattr(allocator, "_vstack_keep_mapped", False), False
    if keep_mapped:
        items = [(p, d) for p, d in items if d.tag not in tags]
    kept_ok = []
    for ptr, data in items:
        size = data.handle[1]
        if data.tag not in tags:
            data._vstack_host = None  # level 2 or an untagged pool: the weights go, their copy too
            discarded += size
            continue
        kept = getattr(data, "_vstack_host", None) if keep else None
        if kept is not None and kept.numel() == size:
            kept_ok.append((ptr, data, kept))
            continue
        spare, data._vstack_spare = getattr(data, "_vstack_spare", None), None  # allocated by `stage`
        host = spare if spare is not None and spare.numel() == size else ops.host_buffer(size)
        ops.to_host(host.data_ptr(), ptr, size)
        data.cpu_backup_tensor = host
        copied += size
    changed = _spot_check(ops, kept_ok) if kept_ok else []
    for ptr, data, kept in changed:  # weights changed while awake: this copy is stale, take a new one
        ops.to_host(kept.data_ptr(), ptr, data.handle[1])
        copied += data.handle[1]
    ops.wait()
    for _ptr, data, kept in kept_ok:
        data.cpu_backup_tensor = kept
    reused = sum(d.handle[1] for _p, d, _k in kept_ok) - sum(d.handle[1] for _p, d, _k in changed)
    t_copy = time.perf_counter()
    for _ptr, data in items:
        try:
            ops.unmap(data.handle)
        finally:
            data.is_asleep = True
    t_unmap = time.perf_counter()
    after_sleep = getattr(ops, "after_sleep", None)  # the memory handoff: exported pieces to the broker
    handed = after_sleep() if after_sleep else {}
    ops.collect()
    done = time.perf_counter()
    gib = 1024**3
    if changed:
        log.warning(
            "vstack sleep: %d allocations changed while awake and were copied again; the kept host copy "
            "assumes weights never change (unset %s for this engine)",
            len(changed),
            KEEP_ENV,
        )
    log.info(
        "vstack sleep: %.2f GiB copied to host (%.1f GB/s), %.2f GiB kept copy reused, %.2f GiB discarded; "
        "copy %.3f s, unmap %.3f s, collect %.3f s",
        copied / gib,
        copied / max(t_copy - t0, 1e-9) / 1e9,
        reused / gib,
        discarded / gib,
        t_copy - t0,
        t_unmap - t_copy,
        done - t_unmap,
    )
    if handed:
        log.info("vstack sleep: %.2f GiB in %d pieces handed to the next engine", handed["handed"] / gib,
                 handed["pieces"])  # fmt: skip
    return {"copied": copied, "reused": reused, "discarded": discarded, "changed": len(changed),
            "seconds": done - t0, **{f"handoff_{k}": v for k, v in handed.items()}}  # fmt: skip


def stage(allocator: Any, ops: Ops, keep: bool, offload_tags: tuple[str, ...] | str = "weights") -> dict[str, float]:
    """What the first level-1 sleep would allocate, now: a host buffer per offloaded allocation (pinned on
    the GPU: the slow part) and, where the copy may be kept (`keep`), the copy itself; the first sleep then
    only checks and unmaps (keep) or only copies (not keep), as later sleeps do."""
    deferred_wake.settle(allocator, ops, keep)
    tags = _tags(offload_tags, allocator.default_tag)
    t0 = time.perf_counter()
    allocated, filled = 0, []
    for ptr, data in list(allocator.pointer_to_data.items()):
        if data.tag not in tags or getattr(data, "is_asleep", False):
            continue
        if getattr(data, "_vstack_host", None) is not None or getattr(data, "_vstack_spare", None) is not None:
            continue  # staged before, or a copy kept from an earlier sleep
        size = data.handle[1]
        host = ops.host_buffer(size)
        allocated += size
        if keep:
            ops.to_host(host.data_ptr(), ptr, size)
            filled.append((data, host))
        else:
            data._vstack_spare = host
    ops.wait()
    for data, host in filled:
        data._vstack_host = host
    seconds = time.perf_counter() - t0
    log.info("vstack stage: %.2f GiB of host buffers ready for the first sleep (%s) in %.2f s", allocated / 1024**3,
             "copy kept" if keep else "allocated only", seconds)  # fmt: skip
    return {"allocated": allocated, "filled": sum(d.handle[1] for d, _h in filled), "seconds": seconds}


def wake_up(allocator: Any, tags: Iterable[str] | None, ops: Ops, keep: bool) -> dict[str, float]:
    """vLLM's CuMemAllocator.wake_up: map the tagged allocations, copy back what was offloaded."""
    wanted = None if tags is None else set(tags)
    t0 = time.perf_counter()
    moved = mapped = 0
    restored = []
    # An allocation a sleep left mapped (KEEP_WEIGHTS_METHOD) is not asleep: nothing to map or copy for it.
    chosen = [(p, d) for p, d in allocator.pointer_to_data.items()
              if (wanted is None or d.tag in wanted) and getattr(d, "is_asleep", True)]  # fmt: skip
    pending = deferred_wake.take(allocator)  # an earlier weights-only wake's copies: waited for with this call's
    before_wake = getattr(ops, "before_wake", None)  # the memory handoff: pieces another engine handed over
    if before_wake:
        before_wake([d.handle[1] for _p, d in chosen], wanted is None or "kv_cache" in wanted)
    zero_if_reused = getattr(ops, "zero_if_reused", None)
    for ptr, data in chosen:
        ops.map(data.handle)
        data.is_asleep = False
        mapped += data.handle[1]
        host = data.cpu_backup_tensor
        if host is not None:
            ops.to_device(ptr, host.data_ptr(), data.handle[1])  # runs while the next allocations map
            moved += data.handle[1]
            restored.append((data, host))
        elif zero_if_reused:
            zero_if_reused(ptr, data.handle[1])
    t_issued = time.perf_counter()
    if pending is None and deferred_wake.should_defer(wanted, restored):  # the KV cache's wake follows
        deferred_wake.defer(allocator, ops, deferred_wake.PendingWake(restored, t0, moved))
    else:
        ops.wait()  # this call's copies and a deferred weights wake's, on the same stream
        deferred_wake.keep_copies(restored, keep)
        if pending is not None:
            deferred_wake.finish(pending, keep, time.perf_counter())
    after_wake = getattr(ops, "after_wake", None)
    handoff = after_wake() if after_wake else None
    done = time.perf_counter()
    gib = 1024**3
    log.info(
        "vstack wake %s: %.2f GiB mapped, %.2f GiB copied to the GPU in %.3f s (%.1f GB/s; maps and issue %.3f s)%s",
        sorted(wanted) if wanted else "all",
        mapped / gib,
        moved / gib,
        done - t0,
        moved / max(done - t0, 1e-9) / 1e9,
        t_issued - t0,
        "; copies left running, waited for by the next call" if getattr(allocator, deferred_wake.ATTR, None) else "",
    )
    return {"mapped": mapped, "moved": moved, "seconds": done - t0,
            **{f"handoff_{k}": v for k, v in (handoff or {}).items()}}  # fmt: skip


def _ops(allocator: Any) -> Any:
    ops = getattr(allocator, "_vstack_ops", None)
    if ops is None:
        ops = CudaOps()
        path = os.environ.get(SOCKET_ENV)
        if path:  # the manager's broker: hand memory over between engines (manager.sleep_handoff, adr/0016)
            from stack.vllm.plugins.handoff import allow_many_descriptors
            from stack.vllm.plugins.runtime_patches.cuda_vmm import Driver
            from stack.vllm.plugins.runtime_patches.sleep_handoff import HandoffOps

            allow_many_descriptors()  # one descriptor per piece while they pass through this process
            device = ops.torch.cuda.current_device()
            uuid = str(ops.torch.cuda.get_device_properties(device).uuid)
            # own_context: the device's primary context made current on this thread, the one torch uses
            ops = HandoffOps(ops, Driver(device, own_context=True), path, uuid, ops.stream.cuda_stream)
        allocator._vstack_ops = ops
    return ops


def _sleep(self: Any, offload_tags: tuple[str, ...] | str | None = None) -> None:
    with _busy:
        sleep(self, offload_tags, _ops(self), keep_enabled())
        self._vstack_sleeps = getattr(self, "_vstack_sleeps", 0) + 1  # done: _sleep_check_beside_a_wake reads it


def _wake_up(self: Any, tags: list[str] | None = None) -> None:
    with _busy:
        wake_up(self, tags, _ops(self), keep_enabled())
    if os.environ.get(SOCKET_ENV):
        tolerate_a_wake_beside_the_sleep()


GREW = "Memory usage increased after sleeping"


def _sleep_check_beside_a_wake(method: Any, allocator_of: Any) -> Any:
    """vLLM's Worker.sleep ends by asserting the GPU's free memory did not fall during the sleep. With the
    memory handoff that sleep frees nothing (its memory goes to the next engine, held by the broker) while the
    next engine may be waking its weights beside it (adr/0035), so the device's free memory falls: the sleep
    is done, the assertion is not. Tolerated only then: our allocator's sleep completed in this call, and the
    assertion is that one. The manager verifies the memory itself (NVML, with the handed-over bytes)."""

    def sleep(self: Any, level: int = 1) -> Any:
        allocator = allocator_of()
        done = getattr(allocator, "_vstack_sleeps", 0)
        try:
            return method(self, level)
        except AssertionError as exc:
            if GREW not in str(exc) or getattr(allocator, "_vstack_sleeps", 0) == done:
                raise
            log.info(
                "vstack sleep: done; the GPU's free memory fell meanwhile (another engine woke beside this one "
                "and this one's memory was handed over), so vLLM's check that a sleep frees memory is skipped"
            )
            return None

    setattr(sleep, MARK, "gpu-sleep-wake-at-bus-speed")
    return sleep


def tolerate_a_wake_beside_the_sleep() -> bool:
    """Wrap the GPU worker's sleep once (_sleep_check_beside_a_wake). Called after a wake, when this engine's
    memory is made of handed-over pieces and its module is loaded (it is the one calling us); True if wrapped."""
    import sys

    module = sys.modules.get("vllm.v1.worker.gpu_worker")
    worker = getattr(module, "Worker", None)
    if worker is None or getattr(worker.sleep, MARK, None):
        return False
    from vllm.device_allocator.cumem import CuMemAllocator

    worker.sleep = _sleep_check_beside_a_wake(worker.sleep, CuMemAllocator.get_instance)
    return True


def _stage_host_copy(self: Any) -> str:
    """collective_rpc target on every worker: start `stage` on a background thread; answers at once."""
    import torch
    from vllm.device_allocator.cumem import CuMemAllocator

    allocator = CuMemAllocator.get_instance()
    if not allocator.pointer_to_data:
        return "nothing to stage (sleep mode off)"
    device = torch.cuda.current_device()

    def run() -> None:
        torch.cuda.set_device(device)
        with _busy:
            try:
                stage(allocator, _ops(allocator), keep_enabled())
            except Exception:  # staging is an optimisation: the first sleep allocates as before
                log.exception("vstack stage failed; the first sleep allocates its host buffers itself")

    threading.Thread(target=run, name="vstack-stage-host-copy", daemon=True).start()
    return "staging"


def _keep_weights_mapped(self: Any) -> str:
    """collective_rpc target: the next sleep leaves the weights mapped (manager.sleep_keeps_weights, adr/0058)."""
    from vllm.device_allocator.cumem import CuMemAllocator

    CuMemAllocator.get_instance()._vstack_keep_mapped = True
    return "the next sleep keeps the weights mapped"


def release_kept(allocator: Any, ops: Ops, keep: bool) -> dict[str, float] | None:
    """The weights a level-1 sleep left mapped (KEEP_WEIGHTS_METHOD), released as that sleep would have released
    them: to the kept host copy (spot-checked) or a new one, unmapped, handed over where a broker waits. None when
    nothing is mapped: the engine is awake (a release never wakes or sleeps anything else) or kept nothing."""
    asleep = {d.tag: getattr(d, "is_asleep", False) for d in allocator.pointer_to_data.values()}  # per tag: alike
    if not any(asleep.values()) or asleep.get("weights", True):
        return None
    return sleep(allocator, ("weights",), ops, keep)  # only the mapped allocations: the weights


def _release_kept_weights(self: Any) -> str:
    """collective_rpc target: release_kept on this worker (another model needs the memory, adr/0058)."""
    from vllm.device_allocator.cumem import CuMemAllocator

    allocator = CuMemAllocator.get_instance()
    with _busy:
        done = release_kept(allocator, _ops(allocator), keep_enabled())
    if done is None:
        return "nothing kept mapped"
    return f"released {(done['copied'] + done['reused']) / 1024**3:.2f} GiB of weights"


def _host_copy_staging(self: Any) -> str:
    """collective_rpc target: "busy" while a staging, sleep or wake holds the lock, else "idle" (answers at once)."""
    return "busy" if _busy.locked() else "idle"


def _free_handed_back(method: Any) -> Any:
    """vLLM's free callback, after an allocation mapped from handoff pieces got a handle of vLLM's own back."""

    def free(self: Any, ptr: int) -> Any:
        ops, data = getattr(self, "_vstack_ops", None), self.pointer_to_data.get(ptr)
        if data is not None and hasattr(ops, "restore_for_free"):
            ops.restore_for_free(data.handle)
        return method(self, ptr)

    setattr(free, MARK, "gpu-sleep-wake-at-bus-speed")
    return free


def _discard_handed_back(method: Any) -> Any:
    """vLLM's discard (0.32+), after the awake allocations it discards got handles of vLLM's own back."""

    def discard(self: Any, tags: tuple[str, ...] | str) -> Any:
        ops = getattr(self, "_vstack_ops", None)
        if hasattr(ops, "restore_for_free"):
            chosen = _tags(tags, self.default_tag)
            for data in self.pointer_to_data.values():
                if data.tag in chosen and not data.is_asleep:
                    ops.restore_for_free(data.handle)
        return method(self, tags)

    setattr(discard, MARK, "gpu-sleep-wake-at-bus-speed")
    return discard


for _fn in (_sleep, _wake_up, _stage_host_copy, _host_copy_staging, _keep_weights_mapped, _release_kept_weights):
    setattr(_fn, MARK, "gpu-sleep-wake-at-bus-speed")


def apply() -> bool:
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return False  # ROCm and XPU allocators differ (hipMemcpyAsync, chunked handles): upstream's path
    from vllm.device_allocator import cumem

    if not cumem.cumem_available:
        return False
    cls = cumem.CuMemAllocator
    if getattr(cls.sleep, MARK, None):
        return False
    cls.sleep, cls.wake_up = _sleep, _wake_up
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    setattr(WorkerWrapperBase, STAGE_METHOD, _stage_host_copy)  # reached by collective_rpc's method name
    setattr(WorkerWrapperBase, STAGING_METHOD, _host_copy_staging)
    setattr(WorkerWrapperBase, KEEP_WEIGHTS_METHOD, _keep_weights_mapped)
    setattr(WorkerWrapperBase, RELEASE_WEIGHTS_METHOD, _release_kept_weights)
    if os.environ.get(SOCKET_ENV):  # before the allocator exists: it keeps its free callback bound at creation
        for name, wrap in (("_python_free_callback", _free_handed_back), ("discard", _discard_handed_back)):
            if hasattr(cls, name):
                setattr(cls, name, wrap(getattr(cls, name)))
    return True
