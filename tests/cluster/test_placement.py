"""The cluster planner (stack.planner.cluster) and the replica strategies (stack.gateway.routing.replicas): pure
logic on small real inputs, no Ray needed."""

from __future__ import annotations

import json

import pytest

from stack.config import load_config
from stack.errors import ConfigError, ExitCode
from stack.gateway.registry import Deployment
from stack.gateway.routing.replicas import ReplicaChooser, affinity_key, rendezvous
from stack.planner.cluster import GIB, ClusterFitError, Demand, NodeRes, check, place


def nodes(*gpus: int, cpus: float = 8, mem: float = 64) -> list[NodeRes]:
    return [NodeRes(f"node{i}" + "x" * 30, f"10.0.0.{i}", cpus, g, int(mem * GIB)) for i, g in enumerate(gpus)]


def test_replicas_spread_one_per_node_before_doubling_up() -> None:
    got = check(place([Demand("m", 3, devices=1)], nodes(2, 2)), nodes(2, 2))
    assert [p.nodes[0][:5] for p in got.places] == ["node0", "node1", "node0"]
    assert all(p.tensor_parallel == 1 and p.pipeline_parallel == 1 for p in got.places)


def test_a_model_larger_than_any_node_is_split_tp_within_pp_across() -> None:
    got = place([Demand("big", 1, devices=16)], nodes(8, 8, 4))
    (p,) = got.places
    assert (p.tensor_parallel, p.pipeline_parallel) == (8, 2)
    assert [n[:5] for n in p.nodes] == ["node0", "node1"]
    assert "pipeline parallel 2" in p.reason


def test_what_cannot_fit_is_refused_with_every_reason_and_what_is_free() -> None:
    ns = nodes(1, 1)
    got = place([Demand("a", 2, devices=1), Demand("b", 1, devices=4)], ns)
    assert len(got.places) == 2 and len(got.refused) == 1
    with pytest.raises(ClusterFitError) as err:
        check(got, ns)
    assert "b replica 1/1: needs 4 GPU" in err.value.message
    assert "10.0.0.0" in err.value.hint and err.value.exit_code == ExitCode.DOES_NOT_FIT


def test_cpu_engines_need_a_node_with_their_cpus_and_ram() -> None:
    ns = nodes(0, 0, cpus=1, mem=4)
    got = place([Demand("cpu", 3, devices=0, cpus=1, memory=3 * GIB)], ns)
    assert len(got.places) == 2 and got.refused == ["cpu replica 3/3: no node has 1 CPU and 3.0 GiB free"]


def test_cpu_build_pipeline_parallel_is_refused_with_vllms_reason() -> None:
    got = place([Demand("cpu", 1, devices=0, pipeline_parallel=2)], nodes(0, 0))
    assert "does not support ray" in got.refused[0]


def test_a_lost_replica_is_placed_away_from_the_survivors() -> None:
    ns = nodes(0, 0, 0, cpus=1)
    got = place([Demand("m", 1, devices=0, cpus=0.5)], ns, held={ns[0].node_id: 1, ns[1].node_id: 0},
                first_index=1)  # fmt: skip
    assert got.places[0].nodes == [ns[1].node_id] and got.places[0].index == 1


def test_dead_nodes_take_nothing() -> None:
    ns = nodes(1, 1)
    ns[0].alive = False
    got = place([Demand("m", 2, devices=1)], ns)
    assert len(got.places) == 1 and got.places[0].nodes == [ns[1].node_id]


def dep(i: int) -> Deployment:
    return Deployment(id=f"engine-m-r{i}", model_group="m", kind="local", upstream_model="m",
                      labels={"replica": str(i), "node": f"n{i}"})  # fmt: skip


def test_least_outstanding_takes_the_idlest_replica() -> None:
    book = ReplicaChooser("least_outstanding")
    deps = [dep(0), dep(1), dep(2)]
    book.begin("engine-m-r0")
    book.begin("engine-m-r1")
    assert book.choose(deps, None).id == "engine-m-r2"
    book.begin("engine-m-r2")
    book.begin("engine-m-r2")
    book.end("engine-m-r0")
    assert book.choose(deps, None).id == "engine-m-r0"


def test_round_robin_takes_turns() -> None:
    book = ReplicaChooser("round_robin")
    deps = [dep(0), dep(1)]
    assert [book.choose(deps, None).id[-2:] for _ in range(4)] == ["r0", "r1", "r0", "r1"]


def test_prefix_affinity_same_prefix_same_replica_and_a_lost_replica_moves_only_its_keys() -> None:
    book = ReplicaChooser("prefix_affinity", prefix_chars=64)
    deps = [dep(0), dep(1), dep(2)]
    shared = "S" * 80
    bodies = [{"messages": [{"role": "system", "content": shared}, {"role": "user", "content": f"q{k}"}]}
              for k in range(5)]  # fmt: skip
    assert len({book.choose(deps, b).id for b in bodies}) == 1  # differs only after the prefix
    keys = [f"prefix-{k}" for k in range(200)]
    before = {k: rendezvous(k, [d.id for d in deps]) for k in keys}
    after = {k: rendezvous(k, [d.id for d in deps if d.id != "engine-m-r1"]) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == "engine-m-r1" for k in moved)
    assert len({v for v in before.values()}) == 3


def test_a_session_names_the_affinity_before_the_prompt() -> None:
    assert affinity_key({"user": "alice", "messages": []}, 10) == "session:alice"
    assert affinity_key({"metadata": {"session_id": "s1"}, "prompt": "x"}, 10) == "session:s1"
    assert affinity_key({"prompt": "abcdefghijklmnop"}, 16)[:10] == "prefix:abc"


def test_replicas_below_one_are_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(text=json.dumps({"manager": {"runtime": "ray", "ray": {"replicas": {"m": 0}}}}))
    assert "replicas" in str(err.value) and "m: 0" in str(err.value)


def test_unknown_replica_routing_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(text=json.dumps({"gateway": {"replica_routing": "random"}}))
    assert "replica_routing" in str(err.value)


def test_replicas_become_deployments_and_only_ready_ones_route() -> None:
    from stack.gateway.engines import sync_replicas
    from stack.gateway.registry import DeploymentRegistry
    from stack.manager.slot import Slot
    from stack.manager.states import ModelState

    registry = DeploymentRegistry()
    registry.add(Deployment(id="engine-m", model_group="m", kind="local", upstream_model="m", state="ready",
                            labels={"runtime": "ray", "role": "set"}))  # fmt: skip
    slot = Slot("m", runtime=None)  # type: ignore[arg-type]  # only its state is read
    slot.state = ModelState.READY
    reps = [{"replica": 0, "state": "ready", "url": "http://10.0.0.1:8001", "node": "aaaa", "detail": ""},
            {"replica": 1, "state": "lost", "url": "http://10.0.0.2:8001", "node": "bbbb", "detail": "gone"}]
    sync_replicas(registry, "engine-m", slot, reps)
    assert [d.id for d in registry.ready("m")] == ["engine-m-r0"]  # the set itself never routes
    assert registry.get("engine-m-r1").state == "failed" and registry.get("engine-m-r1").labels["node"] == "bbbb"
    reps[1] = {**reps[1], "state": "ready", "url": "http://10.0.0.3:8001", "node": "cccc", "detail": "restored"}
    sync_replicas(registry, "engine-m", slot, reps)
    assert sorted(d.id for d in registry.ready("m")) == ["engine-m-r0", "engine-m-r1"]
    assert registry.get("engine-m-r1").api_base == "http://10.0.0.3:8001"
