"""Can a waking engine skip the driver's clearing of memory another engine just released? (issue 14)

`bench/gpu/wake_probe.sh` found the floor of a sleeping switch between two engines: memory one process
releases is cleared by the driver before another process maps it (KV-cache maps 0.2-0.4 s for ~97 GiB,
weights copied in at 27-33 GB/s instead of 45-49 GB/s within one process). CUDA's virtual memory API lets
the sleeping engine hand its physical memory to the waking one instead of releasing it: export each
allocation as a POSIX file descriptor (`cuMemExportToShareableHandle`), pass the descriptors over a Unix
socket (SCM_RIGHTS), import and map them there. Physical memory never returns to the driver, so nothing is
cleared. This probe measures that with the driver API alone (stack.vllm.plugins.runtime_patches.cuda_vmm, ctypes on
libcuda) and the stack's own broker (stack.vllm.plugins.handoff); no vLLM, no torch, no site parts needed:

  fresh      a child process creates, maps and writes GIB in CHUNK pieces, then releases them and exits;
             this process then creates and maps as much (what a wake does today)
  own        this process releases its own memory and creates it again at once (the one-process reference)
  own_later  the same, 2 s after the release (has the driver finished with the released pages by then?)
  released   a child creates, maps and writes GIB, releases it and stays alive; this process creates and maps
             as much at once (a switch today: the sleeping engine released, the waking one maps)
  handoff    a child creates, maps and writes GIB, exports every piece to the broker here, releases its own
             handles; this process takes the pieces, imports and maps them (manager.sleep_handoff's wake)

  drop       a child hands DROP_GIB over to the broker and releases its handles; nobody takes them, and the
             broker's close_window() frees them (what a switch leaves: 16.6 GiB in a 3B -> 8B one), timed
             (adr/0055: freed on a thread of its own since); `--steps drop` runs it alone (no copy or memset)

Each step reports the map time, the copy rate of one pinned host buffer into the mapped memory (a wake's
weights) and then a memset over the whole range (HBM speed unless the pages are still being cleared).
One `HANDOFF_PROBE {json}` line per step.

    python3 -m bench.gpu.handoff_probe [--gib 80] [--chunk-mib 1024] [--copy-gib 8]   (on the lent GPU)
    python3 -m bench.gpu.handoff_probe --steps drop --drop-gib 16 --chunk-mib 512        (~20 s; needs no site)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

from stack.vllm.plugins.handoff import HandoffBroker, put_pieces, take_pieces
from stack.vllm.plugins.runtime_patches.cuda_vmm import CudaError, Driver

GIB = 1024**3


def open_driver(device: int = 0) -> Driver:
    """The stack's driver wrapper, in a process of its own (its own current context)."""
    try:
        return Driver(device, own_context=True)
    except CudaError as exc:
        raise SystemExit(f"{exc}: run this on the lent GPU machine") from exc


class Region:
    """`count` pieces of `chunk` bytes mapped back to back in one reserved range, as an engine's allocation."""

    def __init__(self, drv: Driver, chunk: int, count: int) -> None:
        self.drv, self.chunk, self.count = drv, chunk, count
        self.base = drv.reserve(chunk * count)
        self.handles: list[int] = []

    def create(self) -> None:
        """Fresh physical memory for every piece, mapped: what a wake does without the handoff."""
        self.fill([self.drv.create(self.chunk) for _ in range(self.count)])

    def fill(self, handles: list[int]) -> None:
        for i, h in enumerate(handles):
            self.drv.map(self.base + i * self.chunk, self.chunk, h)
        self.handles = handles

    def release(self) -> None:
        for i, h in enumerate(self.handles):
            self.drv.unmap(self.base + i * self.chunk, self.chunk)
            self.drv.release(h)
        self.handles = []


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def say(step: str, **fields: object) -> None:
    print("HANDOFF_PROBE " + json.dumps({"step": step, **fields}), flush=True)


def measure(drv: Driver, region: Region, step: str, map_s: float, host: int, copy: int, **extra: object) -> None:
    size = region.chunk * region.count
    # The copy first: a wake's weights land in memory just mapped, while the driver may still be clearing it.
    copy_s = timed(lambda: (drv.copy_in(region.base, host, copy), drv.sync()))
    memset_s = timed(lambda: (drv.memset(region.base, size), drv.sync()))
    say(step, gib=round(size / GIB, 2), pieces=region.count, map_s=round(map_s, 4),
        memset_s=round(memset_s, 4), memset_gbps=round(size / memset_s / 1e9, 1),
        copy_gib=round(copy / GIB, 2), copy_gbps=round(copy / copy_s / 1e9, 1), **extra)  # fmt: skip


def drop(chunk_mib: int, pieces: int) -> int:
    """A sleeping engine's pieces that no wake takes, freed by the broker's close_window(), twice: the manager's
    switch waited for it until adr/0055 (on an H200 the time follows the count of pieces, not the bytes)."""
    me = [sys.executable, "-m", "bench.gpu.handoff_probe", "--chunk-mib", str(chunk_mib)]
    for run in range(2):
        broker = HandoffBroker().start()
        broker.open_window()
        try:
            sleeper = subprocess.Popen([*me, "--pieces", str(pieces), "--role", "handoff", "--sock", broker.path],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
            if sleeper.stdout.readline().strip() != "released":
                raise SystemExit("the handing-over process did not release its handles: see its error above")
            held = broker.held_bytes()
            close_s = timed(broker.close_window)
            sleeper.communicate("quit\n", timeout=120)
        finally:
            broker.stop()
        say("drop", run=run, gib=round(held / GIB, 2), pieces=pieces, close_window_s=round(close_s, 4),
            note="close_window() closing the descriptors of memory the sender released: the driver frees it")
    return 0


def child(args: argparse.Namespace) -> int:
    """The engine going to sleep: create, map and write; then release (fresh) or hand over (handoff)."""
    drv = open_driver()
    chunk = args.chunk_mib * 1024**2
    region = Region(drv, chunk, args.pieces)
    region.create()
    drv.memset(region.base, chunk * args.pieces)  # written, as an engine's memory is
    drv.sync()
    if args.role == "handoff":  # through the stack's own broker, as a sleeping engine hands its memory over
        fds = [drv.export(h) for h in region.handles]
        if not put_pieces(args.sock, "probe", [(chunk, fd) for fd in fds]):
            raise SystemExit("the broker did not keep the pieces")
        for fd in fds:
            os.close(fd)
    region.release()  # handoff: the broker's descriptors keep the physical memory alive
    if args.role in ("handoff", "released"):
        print("released", flush=True)
        sys.stdin.readline()  # alive until the receiver has read NVML's per-process figures: whose memory is it now?
    return 0


def gpu_mib_by_pid() -> dict[str, int]:
    """What NVML attributes to each process (nvidia-smi): the manager checks a sleeping engine's memory this way."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=False).stdout  # fmt: skip
    return {p.strip(): int(m) for p, m in (line.split(",") for line in out.splitlines() if "," in line)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=80, help="memory handed over (a KV cache of an 8B at 0.7 of an H200)")
    ap.add_argument("--chunk-mib", type=int, default=1024, help="piece size (a multiple of the granularity, 2 MiB)")
    ap.add_argument("--copy-gib", type=float, default=8, help="pinned host bytes copied into the mapped memory")
    ap.add_argument("--steps", default="all", help="all, or drop: only the leftover's free")
    ap.add_argument("--drop-gib", type=float, default=16.5, help="drop: the bytes nobody takes")
    ap.add_argument("--role", choices=["fresh", "released", "handoff"], help=argparse.SUPPRESS)
    ap.add_argument("--sock", help=argparse.SUPPRESS)
    ap.add_argument("--pieces", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        return child(args)
    chunk = args.chunk_mib * 1024**2
    pieces = max(1, int(args.gib * GIB // chunk))
    me = [sys.executable, "-m", "bench.gpu.handoff_probe", "--chunk-mib", str(args.chunk_mib), "--pieces", str(pieces)]

    # The other engine first, alone on the GPU, as in a switch: this process opens CUDA only after it is gone.
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise SystemExit(f"no NVIDIA driver here ({exc}): run this on the lent GPU machine") from exc
    if args.steps == "drop":
        return drop(args.chunk_mib, max(1, int(args.drop_gib * GIB // chunk)))
    subprocess.run([*me, "--role", "fresh"], check=True)
    drv = open_driver()
    if chunk % drv.granularity:
        raise SystemExit(f"--chunk-mib {args.chunk_mib}: not a multiple of the granularity {drv.granularity}")
    copy = int(args.copy_gib * GIB)
    host = drv.host_pinned(copy)
    region = Region(drv, chunk, pieces)
    map_s = timed(lambda: (region.create(), drv.sync()))
    measure(drv, region, "fresh", map_s, host, copy, note="created after another process released as much")

    region.release()
    map_s = timed(lambda: (region.create(), drv.sync()))
    measure(drv, region, "own", map_s, host, copy, note="created again after this process released its own")
    region.release()
    time.sleep(2)
    map_s = timed(lambda: (region.create(), drv.sync()))
    measure(drv, region, "own_later", map_s, host, copy, note="created again 2 s after this process released its own")
    region.release()

    sleeper = subprocess.Popen([*me, "--role", "released"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if sleeper.stdout.readline().strip() != "released":
        raise SystemExit("the releasing process did not release its memory: see its error above")
    map_s = timed(lambda: (region.create(), drv.sync()))
    measure(drv, region, "released", map_s, host, copy, note="created at once after a live process released as much")
    sleeper.communicate("quit\n", timeout=120)
    region.release()

    broker = HandoffBroker().start()
    broker.open_window()
    try:
        sleeper = subprocess.Popen([*me, "--role", "handoff", "--sock", broker.path], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)  # fmt: skip
        if sleeper.stdout.readline().strip() != "released":
            raise SystemExit("the handing-over process did not release its handles: see its error above")
        fds = [fd for _size, fd in take_pieces(broker.path, "probe", {chunk: pieces})]
        if len(fds) != pieces:
            raise SystemExit(f"the broker handed {len(fds)} of {pieces} pieces")
        t0 = time.perf_counter()
        handles = [drv.import_fd(fd) for fd in fds]
        import_s = time.perf_counter() - t0
        for fd in fds:
            os.close(fd)
        map_s = timed(lambda: (region.fill(handles), drv.sync()))
        by_pid = gpu_mib_by_pid()
        sleeper.communicate("quit\n", timeout=120)
        if sleeper.returncode != 0:
            raise SystemExit("the handing-over process failed: see its error above")
    finally:
        broker.stop()
    measure(drv, region, "handoff", import_s + map_s, host, copy, import_s=round(import_s, 4),
            gpu_mib_by_pid={"receiver" if k == str(os.getpid()) else "sender (released)": v for k, v in by_pid.items()},
            after_sender_exit=gpu_mib_by_pid(),
            note="imported from a process that exported and released its handles")  # fmt: skip
    region.release()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
