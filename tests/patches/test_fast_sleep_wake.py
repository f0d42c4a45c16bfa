"""The sleep/wake runtime patch's bookkeeping (stack/vllm/plugins/runtime_patches/fast_sleep_wake.py) on this CPU.

The GPU's part (cuMemCreate/cuMemMap through vLLM's C extension, cudaMemcpyAsync on a side stream) cannot run
here: `HostDevice` stands in for GPU memory with host buffers that behave like the allocator's virtual
addresses (the address stays, unmap loses the contents, map gives garbage) and copies that are real memmoves.
What is tested is what the patch decides: what is copied, reused, recopied, dropped, and that the bytes that
come back are the bytes that went out. The GPU path is measured by `bash bench/gpu/switch_time.sh pair`.
"""

from __future__ import annotations

import ctypes
import logging
from types import SimpleNamespace

import pytest
import torch
from vllm.device_allocator import AllocationData

from stack.engine.sleep_copy import sleep_copy_env
from stack.planner.keep_host_copy import keep_host_copy
from stack.vllm.plugins.host_copy import KEEP_ENV
from stack.vllm.plugins.runtime_patches import fast_sleep_wake as fsw

MIB = 1024**2


class HostDevice:
    """Allocations at fixed addresses; unmapped memory must never be read or written."""

    def __init__(self) -> None:
        self.buffers: dict[int, ctypes.Array] = {}
        self.mapped: set[int] = set()
        self.copies: list[tuple[str, int]] = []  # (direction, bytes)
        self.waits = 0

    def allocate(self, size: int, fill: int) -> int:
        buf = (ctypes.c_ubyte * size)()
        ctypes.memset(buf, fill, size)
        ptr = ctypes.addressof(buf)
        self.buffers[ptr] = buf
        self.mapped.add(ptr)
        return ptr

    def _owner(self, ptr: int) -> int:
        for base, buf in self.buffers.items():
            if base <= ptr < base + len(buf):
                assert base in self.mapped, "copy from or to unmapped GPU memory"
                return base
        raise AssertionError(f"{ptr:#x} is not device memory")

    def map(self, handle) -> None:
        ptr = handle[2]
        assert ptr not in self.mapped, "mapped twice"
        ctypes.memset(self.buffers[ptr], 0xEE, handle[1])  # fresh physical memory: garbage
        self.mapped.add(ptr)

    def unmap(self, handle) -> None:
        ptr = handle[2]
        assert ptr in self.mapped, "released twice"
        ctypes.memset(self.buffers[ptr], 0xDD, handle[1])
        self.mapped.discard(ptr)

    def host_buffer(self, size: int) -> torch.Tensor:
        return torch.empty(size, dtype=torch.uint8)

    def to_host(self, dst: int, src: int, size: int) -> None:
        self._owner(src)
        ctypes.memmove(dst, src, size)
        self.copies.append(("d2h", size))

    def to_device(self, dst: int, src: int, size: int) -> None:
        self._owner(dst)
        ctypes.memmove(dst, src, size)
        self.copies.append(("h2d", size))

    def wait(self) -> None:
        self.waits += 1

    def collect(self) -> None:
        pass

    def read(self, ptr: int) -> bytes:
        return bytes(self.buffers[ptr])

    def copied(self, direction: str) -> int:
        return sum(n for d, n in self.copies if d == direction)


@pytest.fixture
def engine() -> tuple[HostDevice, SimpleNamespace, dict[str, list[int]]]:
    """Three weight allocations (one of them smaller than the spot-check window) and two KV cache ones."""
    dev = HostDevice()
    table, by_tag = {}, {"weights": [], "kv_cache": []}
    for i, (tag, size) in enumerate([("weights", 3 * MIB), ("weights", 1000), ("weights", 2 * MIB + 5),
                                     ("kv_cache", 4 * MIB), ("kv_cache", 4 * MIB)]):  # fmt: skip
        ptr = dev.allocate(size, fill=i + 1)
        table[ptr] = AllocationData((0, size, ptr, 1000 + i), tag)
        by_tag[tag].append(ptr)
    return dev, SimpleNamespace(pointer_to_data=table, default_tag="default"), by_tag


def weights_bytes(by_tag, dev) -> dict[int, bytes]:
    return {p: dev.read(p) for p in by_tag["weights"]}


def test_level1_round_trip_restores_the_weights_and_discards_the_kv_cache(engine) -> None:
    dev, alloc, by_tag = engine
    before = weights_bytes(by_tag, dev)
    slept = fsw.sleep(alloc, ("weights",), dev, keep=False)
    total_w = sum(len(b) for b in before.values())
    assert slept["copied"] == total_w and slept["reused"] == 0 and slept["discarded"] == 8 * MIB
    assert not dev.mapped and all(d.is_asleep for d in alloc.pointer_to_data.values())
    woke = fsw.wake_up(alloc, None, dev, keep=False)
    assert woke["moved"] == total_w and woke["mapped"] == total_w + 8 * MIB
    assert weights_bytes(by_tag, dev) == before
    assert all(dev.read(p) == b"\xee" * 4 * MIB for p in by_tag["kv_cache"])  # mapped, not restored
    assert all(getattr(d, "_vstack_host", None) is None for d in alloc.pointer_to_data.values())
    assert all(d.cpu_backup_tensor is None for d in alloc.pointer_to_data.values())


def test_kept_copy_makes_the_second_sleep_a_release_only(engine) -> None:
    dev, alloc, by_tag = engine
    before = weights_bytes(by_tag, dev)
    total_w = sum(len(b) for b in before.values())
    fsw.sleep(alloc, ("weights",), dev, keep=True)
    fsw.wake_up(alloc, ["weights"], dev, keep=True)
    fsw.wake_up(alloc, ["kv_cache"], dev, keep=True)  # the manager's split wake
    d2h = dev.copied("d2h")
    again = fsw.sleep(alloc, ("weights",), dev, keep=True)
    assert again["copied"] == 0 and again["reused"] == total_w and again["changed"] == 0
    assert dev.copied("d2h") - d2h < 3 * 2 * fsw.SPOT_BYTES  # only the spot checks crossed the bus
    fsw.wake_up(alloc, None, dev, keep=True)
    assert weights_bytes(by_tag, dev) == before


def test_a_weight_changed_while_awake_is_copied_again_and_said(engine, caplog, monkeypatch) -> None:
    dev, alloc, by_tag = engine
    # An earlier test's logging.config (disable_existing_loggers) may have silenced this logger.
    monkeypatch.setattr(fsw.log, "disabled", False)
    fsw.sleep(alloc, ("weights",), dev, keep=True)
    fsw.wake_up(alloc, None, dev, keep=True)
    ptr = by_tag["weights"][0]
    ctypes.memset(ptr, 0x42, 16)  # e.g. an adapter written into a LoRA slot
    changed = weights_bytes(by_tag, dev)
    with caplog.at_level(logging.WARNING, logger="vllm.vstack_patches.sleep"):
        slept = fsw.sleep(alloc, ("weights",), dev, keep=True)
    assert slept["changed"] == 1 and slept["copied"] == 3 * MIB
    assert KEEP_ENV in caplog.text
    fsw.wake_up(alloc, None, dev, keep=True)
    assert weights_bytes(by_tag, dev) == changed  # the new bytes, not the stale copy


def test_a_sleep_asked_to_keep_the_weights_mapped_releases_only_the_kv_cache(engine) -> None:
    """manager.sleep_keeps_weights (adr/0058): after KEEP_WEIGHTS_METHOD the next sleep neither copies nor unmaps
    the weights (they stay on the GPU, bytes intact), releases the KV cache, and the wake maps the KV cache alone;
    the sleep after that is a whole one again (the request holds for one sleep)."""
    dev, alloc, by_tag = engine
    before = weights_bytes(by_tag, dev)
    alloc._vstack_keep_mapped = True  # what the collective_rpc target sets
    slept = fsw.sleep(alloc, ("weights",), dev, keep=True)
    assert slept["copied"] == 0 and slept["discarded"] == 8 * MIB and not dev.copies
    assert dev.mapped == set(by_tag["weights"]) and weights_bytes(by_tag, dev) == before
    woke_weights = fsw.wake_up(alloc, ["weights"], dev, keep=True)  # the manager's split wake: nothing to do
    assert woke_weights["mapped"] == 0 and woke_weights["moved"] == 0
    woke = fsw.wake_up(alloc, ["kv_cache"], dev, keep=True)
    assert woke["mapped"] == 8 * MIB and weights_bytes(by_tag, dev) == before
    again = fsw.sleep(alloc, ("weights",), dev, keep=True)  # not asked this time: the weights go to the host
    assert again["copied"] == sum(len(b) for b in before.values()) and not dev.mapped
    fsw.wake_up(alloc, None, dev, keep=True)
    assert weights_bytes(by_tag, dev) == before


def test_weights_a_sleep_kept_mapped_are_released_later_and_the_wake_brings_them_back(engine) -> None:
    """RELEASE_WEIGHTS_METHOD (another model needs the memory): the weights a kept sleep left mapped go to a host
    copy and are unmapped; the KV cache, asleep already, is not touched again (HostDevice refuses a second unmap);
    the engine's next wake restores the same bytes. Awake, or with nothing kept, a release does nothing."""
    dev, alloc, by_tag = engine
    before = weights_bytes(by_tag, dev)
    total_w = sum(len(b) for b in before.values())
    assert fsw.release_kept(alloc, dev, keep=True) is None and dev.mapped == set(alloc.pointer_to_data)  # awake
    alloc._vstack_keep_mapped = True
    fsw.sleep(alloc, ("weights",), dev, keep=True)  # the first sleep keeps them: no host copy yet
    released = fsw.release_kept(alloc, dev, keep=True)
    assert released is not None and released["copied"] == total_w and released["discarded"] == 0
    assert not dev.mapped and all(d.is_asleep for d in alloc.pointer_to_data.values())
    assert fsw.release_kept(alloc, dev, keep=True) is None  # nothing mapped any more
    fsw.wake_up(alloc, ["weights"], dev, keep=True)
    fsw.wake_up(alloc, ["kv_cache"], dev, keep=True)
    assert weights_bytes(by_tag, dev) == before
    alloc._vstack_keep_mapped = True  # kept again, now with a host copy from the release: reused, not copied
    fsw.sleep(alloc, ("weights",), dev, keep=True)
    d2h = dev.copied("d2h")
    again = fsw.release_kept(alloc, dev, keep=True)
    assert again is not None and again["copied"] == 0 and again["reused"] == total_w
    assert dev.copied("d2h") - d2h < 3 * 2 * fsw.SPOT_BYTES and not dev.mapped
    fsw.wake_up(alloc, None, dev, keep=True)
    assert weights_bytes(by_tag, dev) == before


def test_level2_drops_the_kept_copies(engine) -> None:
    dev, alloc, by_tag = engine
    fsw.sleep(alloc, ("weights",), dev, keep=True)
    fsw.wake_up(alloc, None, dev, keep=True)
    assert all(alloc.pointer_to_data[p]._vstack_host is not None for p in by_tag["weights"])
    slept = fsw.sleep(alloc, (), dev, keep=True)  # level 2: nothing offloaded
    assert slept["copied"] == 0 and slept["reused"] == 0
    assert all(d._vstack_host is None and d.cpu_backup_tensor is None for d in alloc.pointer_to_data.values())


def test_copies_are_waited_for_once_per_call_not_per_allocation(engine) -> None:
    dev, alloc, _ = engine
    fsw.sleep(alloc, ("weights",), dev, keep=False)
    waits = dev.waits
    fsw.wake_up(alloc, None, dev, keep=False)
    assert dev.waits - waits == 1


@pytest.mark.parametrize(
    ("engine_options", "keep"),
    [
        ({"enable_sleep_mode": True}, True),
        ({"enable_sleep_mode": True, "enable_lora": True}, False),
        ({"enable_sleep_mode": True, "calculate_kv_scales": True}, False),
        ({"enable_sleep_mode": True, "enable_eplb": True}, False),
        ({}, False),
    ],
)
def test_the_host_copy_is_kept_only_where_weights_cannot_change(engine_options, keep) -> None:
    ok, why = keep_host_copy(engine_options)
    assert ok is keep
    assert sleep_copy_env(engine_options) == ({KEEP_ENV: "1"} if keep else {})
    if engine_options.get("enable_lora"):
        assert "LoRA" in why


class CountingDevice(HostDevice):
    """Counts the host buffers asked for: the pinned allocations a first sleep used to pay for."""

    def __init__(self) -> None:
        super().__init__()
        self.host_bytes = 0

    def host_buffer(self, size: int) -> torch.Tensor:
        self.host_bytes += size
        return super().host_buffer(size)


@pytest.fixture
def counting(engine) -> tuple[CountingDevice, SimpleNamespace, dict[str, list[int]]]:
    dev, alloc, by_tag = engine
    counted = CountingDevice()
    counted.buffers, counted.mapped = dev.buffers, dev.mapped
    return counted, alloc, by_tag


def test_staging_with_a_kept_copy_makes_the_first_sleep_cost_what_later_ones_do(counting) -> None:
    dev, alloc, by_tag = counting
    before = weights_bytes(by_tag, dev)
    total_w = sum(len(b) for b in before.values())
    staged = fsw.stage(alloc, dev, keep=True)  # in the background of a serving engine
    assert staged["allocated"] == total_w == staged["filled"] and dev.host_bytes == total_w
    allocated = dev.host_bytes
    first = fsw.sleep(alloc, ("weights",), dev, keep=True)
    assert first["copied"] == 0 and first["reused"] == total_w, "the first sleep only checks and releases"
    assert dev.host_bytes - allocated < 2 * 3 * fsw.SPOT_BYTES  # only the spot checks' scratch buffer
    fsw.wake_up(alloc, None, dev, keep=True)
    assert weights_bytes(by_tag, dev) == before
    assert fsw.stage(alloc, dev, keep=True)["allocated"] == 0, "staged once: a second call does nothing"


def test_staging_without_a_kept_copy_allocates_the_buffers_the_first_sleep_fills(counting) -> None:
    dev, alloc, by_tag = counting
    before = weights_bytes(by_tag, dev)
    total_w = sum(len(b) for b in before.values())
    staged = fsw.stage(alloc, dev, keep=False)  # LoRA engines: the copy may not be kept, the buffers may
    assert staged["allocated"] == total_w and staged["filled"] == 0 and dev.copied("d2h") == 0
    first = fsw.sleep(alloc, ("weights",), dev, keep=False)
    assert first["copied"] == total_w and dev.host_bytes == total_w, "no host buffer allocated by the sleep"
    fsw.wake_up(alloc, None, dev, keep=False)
    assert weights_bytes(by_tag, dev) == before
    assert all(getattr(d, "_vstack_spare", None) is None for d in alloc.pointer_to_data.values())


class QueuedDevice(HostDevice):
    """Copies to the device run at wait(), as a side stream's do: a wake that forgot to wait leaves garbage, and
    an unmap before the wait fails the copy (unmapped memory)."""

    def __init__(self) -> None:
        super().__init__()
        self.queued: list[tuple[int, int, int]] = []
        self.events: list[str] = []

    def to_device(self, dst: int, src: int, size: int) -> None:
        self.queued.append((dst, src, size))

    def wait(self) -> None:
        for dst, src, size in self.queued:
            HostDevice.to_device(self, dst, src, size)
        self.queued.clear()
        self.waits += 1
        self.events.append("wait")

    def fence(self) -> None:
        self.events.append("fence")

    def unmap(self, handle) -> None:
        self.events.append("unmap")
        super().unmap(handle)


@pytest.fixture
def queued(engine, monkeypatch) -> tuple[QueuedDevice, SimpleNamespace, dict[str, list[int]]]:
    """The engine fixture's allocations on a QueuedDevice, in an engine the manager drives (its handoff socket)."""
    _dev, alloc, by_tag = engine
    dev = QueuedDevice()
    dev.buffers, dev.mapped = _dev.buffers, _dev.mapped
    monkeypatch.setenv(fsw.SOCKET_ENV, "/tmp/vstack-handoff-test.sock")
    monkeypatch.delenv("VSTACK_WAKE_DEFER_WEIGHTS", raising=False)
    return dev, alloc, by_tag


def test_an_overlapped_weights_wake_leaves_its_copies_running_until_the_kv_caches_wake(queued) -> None:
    dev, alloc, by_tag = queued
    before = weights_bytes(by_tag, dev)
    fsw.sleep(alloc, ("weights",), dev, keep=True)
    waits = dev.waits
    fsw.wake_up(alloc, ["weights"], dev, keep=True)
    assert dev.waits == waits and dev.events[-1] == "fence"  # no host wait; the compute stream waits on the GPU
    weights = [d for d in alloc.pointer_to_data.values() if d.tag == "weights"]
    assert dev.queued and all(d.cpu_backup_tensor is not None for d in weights)  # the copies' sources still held
    fsw.wake_up(alloc, ["kv_cache"], dev, keep=True)
    assert dev.waits == waits + 1 and not dev.queued  # one wait for both calls' work
    assert weights_bytes(by_tag, dev) == before
    assert all(d.cpu_backup_tensor is None and d._vstack_host is not None for d in weights)  # the kept copy
    assert fsw.sleep(alloc, ("weights",), dev, keep=True)["copied"] == 0  # and the next sleep reuses it


def test_a_sleep_right_after_a_deferred_wake_waits_for_its_copies_before_unmapping(queued) -> None:
    dev, alloc, by_tag = queued
    alloc.pointer_to_data = {p: d for p, d in alloc.pointer_to_data.items() if d.tag == "weights"}  # all awake
    before = weights_bytes(by_tag, dev)
    fsw.sleep(alloc, ("weights",), dev, keep=True)
    fsw.wake_up(alloc, ["weights"], dev, keep=True)
    dev.events.clear()
    # Not kept: this sleep copies the weights to the host again, and would copy what the wake had not yet written
    fsw.sleep(alloc, ("weights",), dev, keep=False)
    assert dev.events[0] == "wait" and "unmap" in dev.events
    fsw.wake_up(alloc, None, dev, keep=False)
    assert weights_bytes(by_tag, dev) == before and not dev.queued


@pytest.mark.parametrize(
    ("env", "tags", "deferred"),
    [
        ({}, ["weights"], True),  # the manager's engine (handoff socket): deferred
        ({"VSTACK_WAKE_DEFER_WEIGHTS": "0"}, ["weights"], False),  # turned off
        ({}, None, False),  # a whole wake maps the KV cache in the same call: waits once, as before
        ({"no socket": ""}, ["weights"], False),  # a caller that may read the weights from the host next
    ],
)
def test_only_a_weights_wake_of_an_engine_the_manager_drives_is_deferred(queued, monkeypatch, env, tags,
                                                                        deferred) -> None:  # fmt: skip
    dev, alloc, _ = queued
    for key, value in env.items():
        if key == "no socket":
            monkeypatch.delenv(fsw.SOCKET_ENV)
        else:
            monkeypatch.setenv(key, value)
    fsw.sleep(alloc, ("weights",), dev, keep=True)
    waits = dev.waits
    fsw.wake_up(alloc, tags, dev, keep=True)
    assert (dev.waits == waits) is deferred and bool(dev.queued) is deferred


def test_a_level2_weights_wake_copies_nothing_and_is_not_deferred(queued) -> None:
    dev, alloc, _ = queued
    fsw.sleep(alloc, (), dev, keep=False)  # level 2: nothing offloaded, vLLM reloads the weights after the wake
    waits = dev.waits
    fsw.wake_up(alloc, ["weights"], dev, keep=False)
    assert dev.waits == waits + 1 and getattr(alloc, "_vstack_pending_wake", None) is None
