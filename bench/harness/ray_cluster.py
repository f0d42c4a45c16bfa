"""A real Ray cluster of several nodes on this machine (Ray's own multi-node test cluster: one raylet per node,
each with its own resources), and the stack built on it by the composition root, as `vstack up --ray` builds
it. Shared by tests/cluster and bench/replica_routing.py; everything started is stopped on exit: the gateway
(its engines), the nodes, the head."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from bench.harness.gateway_thread import Gateway, app_in_thread  # uvicorn in a thread, reachable state

SERVED = "smollm2-135m-instruct"
# Small and quick on 2 shared cores: no torch.compile, a 1 GiB KV cache, threads not pinned.
ENGINE = {"enforce_eager": True, "max_model_len": 1024, "max_num_seqs": 8}
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "HF_HUB_OFFLINE": "1"}


@contextlib.contextmanager
def ray_cluster(workers: int, cpus: float = 1) -> Iterator[object]:
    """Head without CPUs (it places nothing) and `workers` nodes of `cpus` each; all gone afterwards."""
    import ray
    from ray.cluster_utils import Cluster

    # Raylets wait this long for a lost head (Ray's default: 60 s, then they exit with their engines).
    os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", "600")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for _ in range(workers):
            cluster.add_node(num_cpus=cpus)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def stack_config(tmp: Path, model_dir: Path, address: str, replicas: int, routing: str = "least_outstanding",
                 engine: dict | None = None, gateway: dict | None = None):  # fmt: skip
    from stack.config import load_config

    entry = {"name": SERVED, "source": {"path": str(model_dir)}, "served_name": SERVED}
    return load_config(text=json.dumps({
        "models": {SERVED: entry}, "engine": {**ENGINE, **(engine or {})}, "env": ENGINE_ENV,
        "state_dir": str(tmp / "state"),
        "startup_timeout_s": 600, "stop_grace_s": 10,
        "gateway": {"replica_routing": routing, "num_retries": 1, **(gateway or {})},
        "manager": {"runtime": "ray", "idle_ttl_s": 0, "restart_max": 0,
                    "ray": {"address": address, "replicas": {SERVED: replicas}, "health_interval_s": 0.5}},
    }))  # fmt: skip


@contextlib.contextmanager
def ray_gateway_for(cfg, default: str) -> Iterator[tuple[Gateway, object]]:
    """plan_up + build_gateway (the composition root), served in a thread; (gateway, the StackPlan).
    On exit the gateway stops its engines; any engine process that outlived its actor is stopped too and
    named in an AssertionError (there should be none)."""
    from stack.assemble.gateways import build_gateway
    from stack.assemble.planning import Launch, plan_up
    from stack.engine.process import stop_process_tree

    planned = plan_up(cfg, default, on_status=lambda _m: None)
    app, sup = build_gateway(Launch(planned))
    pids: set[tuple[int, str]] = set()  # (pid, port) of every replica seen
    try:
        with app_in_thread(app, graceful_s=5, start_s=60, join_s=60) as (url, loop):
            gw = Gateway(url, app, loop)
            gw.pids = pids  # type: ignore[attr-defined]
            yield gw, planned
    finally:
        for slot in sup.manager.slots.values():
            describe = getattr(slot.runtime, "describe", None)
            record(pids, describe()["replicas"] if describe else [])
        left = [p for pid, port in pids if ours(pid, port) or orphans(pid) for p in stop_process_tree(pid, 5)]
        assert left == [], f"engine processes left running: {left}"


def record(pids: set[tuple[int, str]], replicas: list[dict]) -> None:
    pids.update((r["pid"], r["url"].rsplit(":", 1)[-1]) for r in replicas if r["pid"] and r["url"])


def orphans(pid: int) -> bool:
    """An engine killed with its node (SIGKILL, as its actor died) leaves vLLM's engine-core child running in the
    engine's process group (its id: the engine's pid, a session leader we started): stopped with the group."""
    import sys

    import psutil

    from stack.engine.process import group_members

    if psutil.pid_exists(pid):
        return False
    me = os.path.realpath(sys.executable)
    for proc in group_members(pid):
        with contextlib.suppress(psutil.Error):
            if os.path.realpath(proc.exe()) == me:
                return True
    return False


def ours(pid: int, port: str) -> bool:
    """Still the engine we started (a dead engine's pid may be another process's by now)."""
    import psutil

    try:
        argv = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return "--port" in argv and argv[argv.index("--port") + 1 : argv.index("--port") + 2] == [port]


@contextlib.contextmanager
def ray_gateway(cfg) -> Iterator[Gateway]:
    with ray_gateway_for(cfg, SERVED) as (gw, _planned):
        yield gw


def wait_replicas(gw: Gateway, ready: int, timeout: float, served: str = SERVED) -> list[dict]:
    """The replicas of model `served` once `ready` of them are ready; AssertionError if it fails or the time passes."""
    deadline = time.monotonic() + timeout
    reps: list[dict] = []
    while time.monotonic() < deadline:
        slot = gw.state.manager.slots[served]
        reps = slot.runtime.describe()["replicas"] if hasattr(slot.runtime, "describe") else []
        record(gw.pids, reps)  # type: ignore[attr-defined]
        if sum(r["state"] == "ready" for r in reps) >= ready and str(slot.state) == "ready":
            return reps
        if str(slot.state) == "failed":
            raise AssertionError(f"model failed: {slot.detail}\n{slot.log_tail}")
        time.sleep(0.5)
    raise AssertionError(f"not {ready} ready replicas after {timeout} s: {reps}")
