"""The Ray cluster as the stack sees it: connect once, list the live nodes and what is free on each.

Ray is imported here and in stack.engine.ray_runtime only (the `cluster` extra); nothing else in the
stack needs it. Discovery reads Ray's own per-node resource table, the one vLLM's Ray executor reads.
"""

from __future__ import annotations

import logging
import os

from stack.config.sections.manager import RayRuntimeConfig
from stack.errors import EngineError
from stack.planner.cluster import NodeRes

log = logging.getLogger("stack.engine.ray")


def import_ray():
    try:
        import ray
    except ImportError as exc:
        raise EngineError("manager.runtime is ray but Ray is not installed",
                          hint='pip install "vllm-stack[cluster]" (ray[default]==2.60.0)') from exc
    return ray


def connect(cfg: RayRuntimeConfig):
    """ray.init to the configured cluster (once per process); EngineError naming the address if it fails."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    # The gateway outlives a lost head for as long as Ray lets a driver wait for its GCS (adr/0017).
    os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", "3600")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = None if cfg.address == "auto" and not os.environ.get("RAY_ADDRESS") else cfg.address
    try:
        ray.init(address=address or "auto", namespace=cfg.namespace, log_to_driver=False,
                 logging_level=logging.WARNING, ignore_reinit_error=True)  # fmt: skip
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise EngineError(f"manager.ray.address {cfg.address!r}: no Ray cluster answers ({exc})",
                          hint="start one (ray start --head) or set manager.ray.address / vstack up --ray "
                          "HEAD_IP:6379") from exc  # fmt: skip
    return ray


def nodes() -> list[NodeRes]:
    """Every node Ray knows, with what is free on it now (dead ones with alive=False)."""
    ray = import_ray()
    from ray._private.state import available_resources_per_node

    free = available_resources_per_node()
    out = []
    for n in ray.nodes():
        res = free.get(n["NodeID"], {}) if n.get("Alive") else {}
        out.append(NodeRes(n["NodeID"], n.get("NodeManagerAddress", ""), float(res.get("CPU", 0)),
                           float(res.get("GPU", 0)), int(res.get("memory", 0)), bool(n.get("Alive"))))  # fmt: skip
    return out


def head_reachable(timeout: float = 3.0) -> bool:
    """Whether Ray's control plane (the head's GCS) answers now."""
    ray = import_ray()
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ray head probe")
    try:
        pool.submit(ray.nodes).result(timeout=timeout)
        return True
    except Exception:  # a timeout or any RPC error: the answer is "down", said in /admin/models
        return False
    finally:
        pool.shutdown(wait=False)  # a call hanging on a lost head must not hold the watch


def gcs_address() -> str:
    """The head's GCS address, for engines whose vLLM joins the cluster itself (pipeline parallel)."""
    ray = import_ray()
    return ray.get_runtime_context().gcs_address
