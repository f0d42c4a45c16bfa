"""Placement on a cluster: which node (or nodes) each replica of each model goes to, and why.

Pure: it reads nodes and demands (what Ray reports, what the fit planner decided) and answers with a
placement or every refusal at once, before anything starts (adr/0017-ray-cluster-runtime.md). The rule is
vLLM's: one node when the engine's devices fit one node (tensor parallel within it); else tensor parallel
= the GPUs a node gives, pipeline parallel = the number of such nodes (vLLM's Ray executor). Replicas of
one model are spread: each goes to the node holding the fewest replicas of that model, then the freest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stack.errors import ExitCode, StackError

GIB = 1024**3


class ClusterFitError(StackError):
    """What the cluster cannot hold, every model named with its reason: nothing was started."""

    exit_code = ExitCode.DOES_NOT_FIT


@dataclass
class NodeRes:
    """One node as Ray reports it: its id, its address and the resources still free."""

    node_id: str
    ip: str
    cpus: float
    gpus: float = 0
    memory: int = 0  # bytes Ray may hand out on it (its `memory` resource)
    alive: bool = True

    @property
    def short(self) -> str:
        return self.node_id[:8]


@dataclass(frozen=True)
class Demand:
    """One model's ask: `replicas` engines, each `devices` GPUs (tensor x pipeline parallel the engine
    options set; 0 on the CPU build) plus `cpus` Ray CPUs and `memory` bytes of host RAM per node used."""

    model: str
    replicas: int
    devices: int = 0
    cpus: float = 1
    memory: int = 0
    pipeline_parallel: int = 1  # set by the user: kept as asked


@dataclass
class ReplicaPlace:
    model: str
    index: int
    nodes: list[str]  # node ids: one, or one per pipeline stage
    tensor_parallel: int
    pipeline_parallel: int
    reason: str
    ips: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"model": self.model, "replica": self.index, "nodes": [n[:8] for n in self.nodes], "ips": self.ips,
                "tensor_parallel": self.tensor_parallel, "pipeline_parallel": self.pipeline_parallel,
                "reason": self.reason}  # fmt: skip


@dataclass
class Placement:
    places: list[ReplicaPlace]
    refused: list[str]

    def of(self, model: str) -> list[ReplicaPlace]:
        return [p for p in self.places if p.model == model]


def place(demands: list[Demand], nodes: list[NodeRes], held: dict[str, int] | None = None,
          first_index: int = 0) -> Placement:  # fmt: skip
    """Every replica of every demand on the live nodes, greedily in the order given; what does not fit
    is listed in `refused` with the reason (the caller refuses the whole plan: all or nothing). `held`:
    replicas of the model already running per node (a lost replica is placed again away from the others)."""
    free = {n.node_id: NodeRes(n.node_id, n.ip, n.cpus, n.gpus, n.memory) for n in nodes if n.alive}
    places: list[ReplicaPlace] = []
    refused: list[str] = []
    for d in demands:
        held = dict(held or {})
        for i in range(first_index, first_index + d.replicas):
            spot = _place_one(d, i, list(free.values()), held)
            if isinstance(spot, str):
                refused.append(f"{d.model} replica {i + 1}/{d.replicas}: {spot}")
                continue
            for node_id in spot.nodes:
                n = free[node_id]
                n.cpus -= d.cpus if node_id == spot.nodes[0] else 0
                n.gpus -= spot.tensor_parallel if d.devices else 0
                n.memory -= d.memory
                held[node_id] = held.get(node_id, 0) + 1
            spot.ips = [free[n].ip for n in spot.nodes]
            places.append(spot)
    return Placement(places, refused)


def check(placement: Placement, nodes: list[NodeRes]) -> Placement:
    """The placement, or ClusterFitError naming every refused replica and what the cluster has."""
    if placement.refused:
        have = "; ".join(f"{n.short} ({n.ip}): {n.cpus:g} CPU, {n.gpus:g} GPU, {n.memory / GIB:.1f} GiB"
                         for n in nodes if n.alive) or "no live node"  # fmt: skip
        raise ClusterFitError("the cluster cannot hold " + "; ".join(placement.refused),
                              hint=f"free on the cluster: {have}. Lower replicas, add nodes, or shrink the model")
    return placement


def _order(nodes: list[NodeRes], held: dict[str, int]) -> list[NodeRes]:
    # Spread a model's replicas (a lost node takes as few of them as possible), then the freest node.
    return sorted(nodes, key=lambda n: (held.get(n.node_id, 0), -n.gpus, -n.cpus, n.node_id))


def _fits_host(d: Demand, n: NodeRes, first: bool) -> bool:
    return (not first or n.cpus >= d.cpus) and (d.memory == 0 or n.memory >= d.memory)


def _place_one(d: Demand, i: int, nodes: list[NodeRes], held: dict[str, int]) -> ReplicaPlace | str:
    if d.devices == 0:  # the CPU build: one node, its CPUs and RAM
        if d.pipeline_parallel > 1:
            return ("pipeline parallel needs vLLM's Ray executor, which the CPU build does not support "
                    "(its platform has no Ray device: 'current platform cpu does not support ray')")
        for n in _order(nodes, held):
            if _fits_host(d, n, True):
                return ReplicaPlace(d.model, i, [n.node_id], 1, 1,
                                    f"node {n.short}: {d.cpus:g} CPU and {d.memory / GIB:.1f} GiB free there "
                                    f"({held.get(n.node_id, 0)} replicas of it before)")  # fmt: skip
        return f"no node has {d.cpus:g} CPU and {d.memory / GIB:.1f} GiB free"
    if d.pipeline_parallel == 1:
        for n in _order(nodes, held):
            if n.gpus >= d.devices and _fits_host(d, n, True):
                return ReplicaPlace(d.model, i, [n.node_id], d.devices, 1,
                                    f"node {n.short}: {d.devices} GPU free there, tensor parallel {d.devices} "
                                    "within the node")  # fmt: skip
    # Across nodes: tensor parallel = GPUs per node, pipeline parallel = nodes (vLLM's rule for Ray).
    widths = [d.devices // d.pipeline_parallel] if d.pipeline_parallel > 1 else _widths(d.devices, nodes)
    for tp in widths:
        if tp < 1 or d.devices % tp:
            continue
        pp = d.devices // tp
        ready = [n for n in _order(nodes, held) if n.gpus >= tp and _fits_host(d, n, False)]
        first = [n for n in ready if n.cpus >= d.cpus]
        if len(ready) >= pp and first:
            chosen = [first[0], *[n for n in ready if n is not first[0]][: pp - 1]]
            return ReplicaPlace(d.model, i, [n.node_id for n in chosen], tp, pp,
                                f"{d.devices} GPU do not fit one node: tensor parallel {tp} within each of {pp} "
                                f"nodes ({', '.join(n.short for n in chosen)}), pipeline parallel {pp} across them")
    most = max((n.gpus for n in nodes), default=0)
    return f"needs {d.devices} GPU; the most free on one node is {most:g} and no split over nodes fits"


def _widths(devices: int, nodes: list[NodeRes]) -> list[int]:
    """Tensor-parallel widths to try across nodes, widest first: each a divisor of `devices` no node
    exceeds (a pipeline of few wide stages beats many thin ones: fewer hops between nodes)."""
    most = int(max((n.gpus for n in nodes), default=0))
    return [w for w in range(min(most, devices), 0, -1) if devices % w == 0 and math.ceil(devices / w) > 1]
