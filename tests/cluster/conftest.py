"""tests/cluster: a real local Ray cluster of several nodes and the stack on it (bench/harness/ray_cluster.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from bench.harness.ray_cluster import SERVED, ray_cluster, ray_gateway, stack_config, wait_replicas

__all__ = ["SERVED", "ray_cluster", "ray_gateway", "stack_config", "wait_replicas"]
