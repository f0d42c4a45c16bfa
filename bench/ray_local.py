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

from tests.support.app_thread import Gateway, app_in_thread  # uvicorn in a thread, reachable state

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
                 engine: dict | None = None):  # fmt: skip
    from stack.config import load_config

    entry = {"name": SERVED, "source": {"path": str(model_dir)}, "served_name": SERVED}
    return load_config(text=json.dumps({
        "models": {SERVED: entry}, "engine": {**ENGINE, **(engine or {})}, "env": ENGINE_ENV,
        "state_dir": str(tmp / "state"),
        "startup_timeout_s": 600, "stop_grace_s": 10,
        "gateway": {"replica_routing": routing, "num_retries": 1},
        "manager": {"runtime": "ray", "idle_ttl_s": 0, "restart_max": 0,
                    "ray": {"address": address, "replicas": {SERVED: replicas}, "health_interval_s": 0.5}},
    }))  # fmt: skip


@contextlib.contextmanager
def ray_gateway(cfg) -> Iterator[Gateway]:
    """plan_engines + build_gateway (the composition root), served in a thread; engines stopped on exit."""
    from stack.assemble import build_gateway, plan_engines
    from stack.engine.process import stop_process_tree

    planned = plan_engines(cfg, SERVED, on_status=lambda _m: None)
    app, sup = build_gateway(planned)
    pids: set[int] = set()
    try:
        with app_in_thread(app, graceful_s=5, start_s=60, join_s=60) as (url, loop):
            gw = Gateway(url, app, loop)
            gw.pids = pids  # type: ignore[attr-defined]
            yield gw
    finally:
        for slot in sup.manager.slots.values():
            describe = getattr(slot.runtime, "describe", None)
            pids.update(r["pid"] for r in (describe()["replicas"] if describe else []) if r["pid"])
        # Engines the stack started and that outlived their actor (there should be none) are stopped too.
        left = [pid for pid in pids for pid in stop_process_tree(pid, 5)]
        assert left == [], f"engine processes left running: {left}"


def wait_replicas(gw: Gateway, ready: int, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    reps: list[dict] = []
    while time.monotonic() < deadline:
        slot = gw.state.manager.slots[SERVED]
        reps = slot.runtime.describe()["replicas"] if hasattr(slot.runtime, "describe") else []
        gw.pids.update(r["pid"] for r in reps if r["pid"])  # type: ignore[attr-defined]
        if sum(r["state"] == "ready" for r in reps) >= ready and str(slot.state) == "ready":
            return reps
        if str(slot.state) == "failed":
            raise AssertionError(f"model failed: {slot.detail}\n{slot.log_tail}")
        time.sleep(0.5)
    raise AssertionError(f"not {ready} ready replicas after {timeout} s: {reps}")
