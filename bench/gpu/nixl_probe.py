"""Does NIXL move bytes between two processes on this machine, and how fast? (issue 55, adr/0052)

    python3 -m bench.gpu.nixl_probe [--configs "cuda cuda+pinned-tls cpu"] [--mib 512] [--timeout 30]

The disaggregated engines' first GPU run (bench/results/2026-11-29-h200-x2-disaggregation-nixl) spent a whole
device call to learn that no NIXL read completed between its two GPUs. This asks the same question in seconds,
before any engine starts: per config, a target process registers a buffer and an initiator READs it the way vLLM's
NixlConnector does (the UCX backend, `initialize_xfer("READ")`, then `check_xfer_state` polled), each process seeing
only its own GPU (CUDA_VISIBLE_DEVICES, as the Ray-placed engines do). Configs:

    cuda               GPU memory both sides (kv_buffer_device cuda, vLLM's default), UCX's own transport choice
    cuda+pinned-tls    the same with UCX_TLS=cuda_copy,cuda_ipc,tcp UCX_MEMTYPE_CACHE=n (ai-dynamo/nixl#1614)
    cuda-vmm           GPU memory from vLLM's sleep-mode allocator (CuMemAllocator: CUDA virtual memory), as an
                       engine with --enable-sleep-mode holds its KV cache (needs vLLM); diagnostic only: on the
                       lent x2 such engines moved KV at 63 MB/s where `cuda` read at 383 GB/s (adr/0052)
    cpu                host memory both sides (kv_buffer_device cpu: vLLM copies the KV through it)

Prints a NIXL_PROBE line of JSON per config: "done" (with the first read's seconds, which include UCX's connection,
the best of the next reads in GB/s, and whether the bytes arrived intact) or the state it was stuck in. Needs torch
and NIXL (the GPU site with the NIXL part: bench/gpu/build_nixl_part.sh); with one GPU both sides share it; on a
machine without GPUs only `cpu` runs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from multiprocessing.connection import Connection
from typing import Any

PINNED_TLS = {"UCX_TLS": "cuda_copy,cuda_ipc,tcp", "UCX_MEMTYPE_CACHE": "n"}
CONFIGS: dict[str, tuple[str, dict[str, str]]] = {
    "cuda": ("cuda", {}),
    "cuda+pinned-tls": ("cuda", PINNED_TLS),
    "cuda-vmm": ("cuda-vmm", {}),
    "cpu": ("cpu", {}),
}
READS = 4  # the first sets up UCX's connection; the best of the rest is the bandwidth
START_S = 120  # torch, CUDA and NIXL starting in a fresh process, with room for a busy host


def _buffer(device: str, nbytes: int, fill: bool) -> Any:
    import contextlib

    import torch

    where = "cpu" if device == "cpu" else "cuda:0"  # the process sees its one GPU as cuda:0
    pool: Any = contextlib.nullcontext()
    if device == "cuda-vmm":  # where an engine with sleep mode puts its KV cache
        from vllm.device_allocator.cumem import CuMemAllocator

        pool = CuMemAllocator.get_instance().use_memory_pool(tag="kv_cache")
    with pool:
        buf = torch.zeros(nbytes, dtype=torch.uint8, device=where)
    if fill:
        buf.copy_((torch.arange(nbytes, dtype=torch.int64, device=where) % 251).to(torch.uint8))
    return buf


def _agent(name: str) -> Any:
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


def _target(pipe: Connection, gpu: str, device: str, nbytes: int, env: dict[str, str]) -> None:
    os.environ.update({"CUDA_VISIBLE_DEVICES": gpu, **env})
    buf = _buffer(device, nbytes, fill=True)
    agent = _agent("target")
    agent.register_memory(buf)
    pipe.send((agent.get_agent_metadata(), agent.get_serialized_descs(agent.get_xfer_descs(buf)), int(buf.sum())))
    pipe.recv()  # the initiator's "finished": the buffer must stay registered until then


def _initiator(pipe: Connection, gpu: str, device: str, nbytes: int, env: dict[str, str], timeout: float) -> None:
    os.environ.update({"CUDA_VISIBLE_DEVICES": gpu, **env})
    buf = _buffer(device, nbytes, fill=False)
    agent = _agent("initiator")
    agent.register_memory(buf)
    metadata, descs, checksum = pipe.recv()
    remote = agent.add_remote_agent(metadata)
    handle = agent.initialize_xfer("READ", agent.get_xfer_descs(buf), agent.deserialize_descs(descs), remote)
    seconds = []
    for _ in range(READS):
        t0 = time.perf_counter()
        state = agent.transfer(handle)
        while state == "PROC" and time.perf_counter() - t0 < timeout:
            state = agent.check_xfer_state(handle)
        if state != "DONE":
            pipe.send({"state": "stuck" if state == "PROC" else "error", "nixl_state": state,
                       "after_s": round(time.perf_counter() - t0, 1), "reads_done": len(seconds)})  # fmt: skip
            return
        seconds.append(time.perf_counter() - t0)
    intact = int(buf.sum()) == checksum
    best = min(seconds[1:])
    pipe.send({"state": "done", "first_read_s": round(seconds[0], 4), "gb_s": round(nbytes / best / 1e9, 2),
               "intact": intact})  # fmt: skip


def probe(config: str, gpus: tuple[str, str], mib: int, timeout: float) -> dict[str, Any]:
    """One config in two fresh processes (UCX reads its environment once, at its start)."""
    device, env = CONFIGS[config]
    ctx = mp.get_context("spawn")
    t_pipe, t_end = ctx.Pipe()
    i_pipe, i_end = ctx.Pipe()
    nbytes = mib * 2**20
    target = ctx.Process(target=_target, args=(t_end, gpus[1], device, nbytes, env), daemon=True)
    initiator = ctx.Process(target=_initiator, args=(i_end, gpus[0], device, nbytes, env, timeout), daemon=True)
    out: dict[str, Any] = {"config": config, "buffer": device, "mib": mib, "gpus": f"{gpus[0]}<-{gpus[1]}", **env}
    target.start()
    initiator.start()
    try:
        if not t_pipe.poll(START_S):
            return {**out, "state": "target did not start", "target_exit": target.exitcode}
        i_pipe.send(t_pipe.recv())
        if not i_pipe.poll(START_S + timeout * (READS + 1)):
            return {**out, "state": "initiator did not answer", "initiator_exit": initiator.exitcode}
        return {**out, **i_pipe.recv()}
    except (EOFError, OSError) as exc:
        return {**out, "state": f"a side exited ({type(exc).__name__})", "target_exit": target.exitcode,
                "initiator_exit": initiator.exitcode}  # fmt: skip
    finally:
        if t_pipe.writable and target.is_alive():
            t_pipe.send("finished")
        for p in (initiator, target):
            p.join(5)
            if p.is_alive():
                p.kill()


def gpu_pair() -> tuple[str, str] | None:
    """(initiator, target) GPUs: 0 and 1 where there are two, 0 and 0 with one, None without."""
    try:
        import torch

        n = torch.cuda.device_count()
    except Exception:  # no torch or no driver: no GPUs for this probe
        n = 0
    return None if n == 0 else ("0", "1" if n > 1 else "0")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=" ".join(CONFIGS), help=f"of {', '.join(CONFIGS)}")
    ap.add_argument("--mib", type=int, default=512, help="bytes moved per read (512 MiB: ~2,000 8B KV blocks)")
    ap.add_argument("--timeout", type=float, default=30, help="seconds a read may stay in progress")
    args = ap.parse_args(argv)
    unknown = [c for c in args.configs.split() if c not in CONFIGS]
    if unknown:
        ap.error(f"--configs: unknown {', '.join(unknown)}; choose from {', '.join(CONFIGS)}")
    pair = gpu_pair()
    for config in args.configs.split():
        if CONFIGS[config][0] != "cpu" and pair is None:
            result = {"config": config, "state": "skipped: no GPU here"}
        else:
            result = probe(config, pair or ("", ""), args.mib, args.timeout)
        print("NIXL_PROBE " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
