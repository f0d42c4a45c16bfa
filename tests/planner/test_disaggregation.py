"""Prefill/decode disaggregation as a model's option (adr/0052): the key, its refusals (each naming the place and
the fix), the engines' rendered options as the installed vLLM's own parser and config classes read them, and the
Ray replicas' phases. Pure planner and config tests: no engine starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stack.config import load_config
from stack.errors import ConfigError
from stack.hardware import GpuInfo, HardwareInfo
from stack.planner.cluster import GIB, NodeRes, ReplicaPlace
from stack.planner.disaggregation_args import FLAG, side_channel
from stack.planner.model_planner import plan_model
from stack.vllm.options import VllmCatalog
from tests.conftest import load_catalog

MODEL = "llama-3.1-8b-instruct"
H200X2 = HardwareInfo(gpus=[GpuInfo(i, "NVIDIA H200", int(139.8 * GIB), int(139 * GIB), "9.0") for i in range(2)],
                      cpu_count=16, ram_total=1 << 40, ram_available=1 << 40)  # fmt: skip
CPU = HardwareInfo(cpu_count=2, ram_total=16 << 30, ram_available=8 << 30)


def config(split: dict | None = None, runtime: str = "ray", **more):
    entry = {"disaggregation": split if split is not None else {"prefill": 1, "decode": 1}}
    return load_config(text=json.dumps({"manager": {"runtime": runtime, **more.pop("manager", {})},
                                        "models": {MODEL: entry}, **more}))  # fmt: skip


def plan(cfg, catalog: VllmCatalog | None = None, hardware: HardwareInfo = H200X2, target: str = MODEL):
    return plan_model(cfg, target, hardware, catalog or load_catalog("0.32"), for_launch=False)


def refusal(cfg, **kw) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        plan(cfg, **kw)
    return err.value


def test_both_sides_get_nixl_and_vllms_own_parser_and_config_accept_the_command() -> None:
    p = plan(config({"prefill": 2, "decode": 1}))
    args = list(p.args)
    assert json.loads(args[args.index(FLAG) + 1]) == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert side_channel(args) and not side_channel(["--port", "1"])
    assert p.disaggregation is not None and p.disaggregation.phases() == ("prefill", "prefill", "decode")
    note = next(n for n in p.notes if n.startswith("disaggregation:"))
    assert note.startswith("disaggregation: 2 prefill + 1 decode engines x 1 GPU each = 3 GPUs")
    assert "no GPU buffer of its own" in note
    probe = """
import json, sys
from stack.vllm.introspect import check, kv_connectors
from vllm.config.kv_transfer import KVTransferConfig
argv = sys.argv[1:]
made = KVTransferConfig(**json.loads(argv[argv.index("--kv-transfer-config") + 1]))
print(json.dumps({"parsed": check(["some/model", *argv]), "connector": made.kv_connector, "role": made.kv_role,
                  "registered": made.kv_connector in kv_connectors()}))
"""
    out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "parsed": {"ok": True},
        "connector": "NixlConnector",
        "role": "kv_both",
        "registered": True,
    }


def test_a_profiles_own_disaggregation_is_the_one_planned_and_its_buffer_on_the_host_is_said() -> None:
    cfg = config(engine={"kv_transfer_config": {"kv_buffer_device": "cpu"}},
                 profiles={"pd": {"hardware": "h200", "model": MODEL,
                                  "disaggregation": {"prefill": 1, "decode": 3}}})  # fmt: skip
    p = plan(cfg, target="pd")
    args = list(p.args)
    assert json.loads(args[args.index(FLAG) + 1]) == {"kv_buffer_device": "cpu", "kv_connector": "NixlConnector",
                                                      "kv_role": "kv_both"}  # fmt: skip
    assert p.disaggregation.phases() == ("prefill", "decode", "decode", "decode")
    assert "a host buffer as large as its KV cache, the blocks it sends copied there (kv_buffer_device: cpu)" in (
        p.notes[-1]
    )


def test_on_the_cpu_the_engines_send_from_a_host_buffer_vllms_only_one_there() -> None:
    p = plan(config(), hardware=CPU)
    args = list(p.args)
    assert json.loads(args[args.index(FLAG) + 1]) == {"kv_buffer_device": "cpu", "kv_connector": "NixlConnector",
                                                      "kv_role": "kv_both"}  # fmt: skip
    assert "(kv_buffer_device: cpu)" in p.notes[-1]


def test_each_engine_gets_its_sides_role_as_vllm_asks_of_nixl() -> None:
    from stack.planner.disaggregation_args import for_phase

    args = list(plan(config()).args)
    roles = {phase: json.loads(for_phase(args, phase)[args.index(FLAG) + 1]) for phase in ("prefill", "decode")}
    assert roles == {"prefill": {"kv_connector": "NixlConnector", "kv_role": "kv_producer"},
                     "decode": {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}}  # fmt: skip
    assert for_phase(args, "") == args and for_phase(["--port", "1"], "decode") == ["--port", "1"]


def test_the_key_refuses_counts_below_one_and_a_connector_vllm_removed() -> None:
    with pytest.raises(ConfigError) as err:
        config({"prefill": 0, "decode": 1})
    assert "models.llama-3.1-8b-instruct.disaggregation.prefill" in str(err.value)
    assert "greater than or equal to 1" in str(err.value)
    with pytest.raises(ConfigError) as err:
        config({"prefill": 1, "decode": 1, "connector": "p2p-nccl"})
    assert (
        "connector 'p2p-nccl': P2pNcclConnector (removed from vLLM: vllm-project/vllm#44854); use connector: "
        "nixl" in str(err.value)
    )


def test_a_connector_the_installed_vllm_lacks_is_refused_naming_the_key_and_its_connectors() -> None:
    base = load_catalog("0.32")
    lacking = VllmCatalog(base.distribution, base.version, [], ["ExampleConnector", "MooncakeConnector"])
    lacking.options = base.options
    err = refusal(config(), catalog=lacking)
    assert err.message == (
        "<inline>: models.llama-3.1-8b-instruct.disaggregation.connector: nixl needs vLLM's NixlConnector, which "
        f"{base.distribution} {base.version} does not register (its connectors: ExampleConnector, MooncakeConnector)"
    )
    assert "install a vLLM with NixlConnector" in (err.hint or "")


def test_what_cannot_run_disaggregated_is_refused_before_anything_starts() -> None:
    local = refusal(config(runtime="local"))
    assert "runs its 2 engines as Ray replicas; manager.runtime is local" in local.message
    assert "set manager.runtime: ray" in (local.hint or "")
    cpu_cuda = refusal(config(engine={"kv_transfer_config": {"kv_buffer_device": "cuda"}}), hardware=CPU)
    assert "kv_buffer_device cuda on a CPU profile (cpu)" in cpu_cuda.message
    assert "remove kv_buffer_device from kv_transfer_config" in (cpu_cuda.hint or "")
    dp = refusal(config(profiles={"pd4": {"hardware": "h200-x4", "model": MODEL, "engine": {"data_parallel_size": 2},
                                          "disaggregation": {"prefill": 1, "decode": 1}}}), target="pd4")  # fmt: skip
    assert dp.message.startswith(
        "<inline>: profiles.pd4.engine.data_parallel_size: data_parallel_size with "
        "<inline>: profiles.pd4.disaggregation: each prefill and decode engine is one copy"
    )
    assert "raise prefill or decode" in (dp.hint or "")
    kv = refusal(config(gateway={"replica_routing_models": {MODEL: "kv_events"}}))
    assert "kv_events" in kv.message and "least_outstanding or round_robin" in (kv.hint or "")
    twice = refusal(config(manager={"ray": {"replicas": {MODEL: 3}}}))
    assert f"manager.ray.replicas.{MODEL} both say how many engines" in twice.message
    own = refusal(config(engine={"kv_transfer_config": {"kv_connector": "LMCacheConnectorV1"}}))
    assert "kv_connector LMCacheConnectorV1 with" in own.message and "remove kv_connector" in (own.hint or "")


def test_more_engines_than_the_clusters_gpus_is_refused_with_the_key() -> None:
    from stack.planner.stack_planner import place_on_cluster

    cfg = config({"prefill": 2, "decode": 2})
    p = plan(cfg)
    nodes = [NodeRes("a" * 32, "10.0.0.1", 16, 2, 64 * GIB)]
    with pytest.raises(ConfigError) as err:
        place_on_cluster(cfg, [p], nodes)
    assert err.value.message == (f"disaggregation of {p.served_name}: 2 prefill + 2 decode engines x 1 GPU(s) need "
                                 "4 GPUs; the Ray cluster has 2 free")  # fmt: skip
    assert "lower prefill or decode" in (err.value.hint or "")
    placed = place_on_cluster(config({"prefill": 1, "decode": 1}), [plan(config())], nodes)
    assert [pl.index for pl in placed.places] == [0, 1]


def test_each_ray_replica_carries_its_phase_to_the_gateway() -> None:
    from stack.config.sections.manager import RayRuntimeConfig
    from stack.engine.ray_runtime import RayReplicaSet
    from stack.planner.cluster import Demand
    from stack.planner.stack_planner import runs_on

    cfg = config({"prefill": 1, "decode": 2})
    p = plan(cfg)
    places = [ReplicaPlace(p.served_name, i, ["n" * 32], 1, 1, "the freest node") for i in range(3)]
    spec = type("Spec", (), {"name": "m", "log_path": Path("/tmp/m.log"), "api_key": None})()
    made = RayReplicaSet(spec, places, Demand(p.served_name, 3, 1), RayRuntimeConfig(), True,  # type: ignore[arg-type]
                         p.disaggregation.phases())  # fmt: skip
    assert [r["phase"] for r in made.replicas()] == ["prefill", "decode", "decode"]
    from stack.planner.cluster import Placement

    where = runs_on(cfg, p, None, Placement(places, []))
    assert where.detail.startswith("replica 0 (prefill): the freest node; replica 1 (decode): the freest node")
    assert where.detail.endswith("; decode choice: least_outstanding")


def test_a_disaggregated_models_engines_run_without_sleep_mode_whoever_asked_for_it() -> None:
    # manager.sleep auto turns sleep mode on for `vstack down` (down_keeps_asleep); NIXL registers each engine's
    # KV cache once at its start, and a sleep would unmap that memory under it (adr/0052).
    from stack.planner.stack_planner import with_sleep

    cfg, why = with_sleep(config(), H200X2)
    assert cfg.engine.get("enable_sleep_mode") is True and why  # what every other engine gets
    p = plan(cfg)
    assert "--enable-sleep-mode" not in p.args and not p.can_sleep
    note = next(n for n in p.notes if n.startswith("sleep mode off"))
    assert note.startswith(f"sleep mode off for {p.served_name}'s engines") and "NIXL registers" in note
    alone = plan(config(), target=MODEL)  # without disaggregation's engines the same model keeps what it was given
    other = plan(with_sleep(load_config(text=json.dumps({"manager": {"runtime": "ray"}, "models": {MODEL: {}}})),
                            H200X2)[0])  # fmt: skip
    assert "--enable-sleep-mode" in other.args and other.can_sleep
    assert not any(n.startswith("sleep mode off") for n in alone.notes + other.notes)
