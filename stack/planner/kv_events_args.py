"""The engine options of a model routed on its engines' own KV events (gateway.replica_routing: kv_events).

Each replica's engine publishes vLLM's KV events (BlockStored, BlockRemoved, AllBlocksCleared) on a ZMQ socket
of its own, with vLLM's replay socket beside it; the gateway subscribes (stack.gateway.routing.kv_events). The
plan renders `--kv-events-config` with placeholder endpoints, checked by vLLM's own parser like every option;
each replica's start replaces them with sockets picked on its node (`with_endpoints`, called by the Ray host),
as it picks the replica's HTTP port. Prefix caching is on: without it the engine stores no blocks to report.
"""

from __future__ import annotations

import json
from typing import Any

from stack.config.resolve import ResolvedProfile
from stack.config.schema import StackConfig
from stack.errors import ConfigError
from stack.vllm.options import VllmCatalog

OPTION = "kv_events_config"
FLAG = "--kv-events-config"
# Replaced at each replica's start; vLLM's own default publish address, so the plan shows a command that runs.
PLACEHOLDER = "tcp://*:5557"
PLACEHOLDER_REPLAY = "tcp://*:5558"


def routes_on_kv_events(cfg: StackConfig, resolved: ResolvedProfile) -> bool:
    """Whether this model's replicas are routed on KV events: only Ray replicas are chosen among."""
    routing = cfg.gateway.replica_routing_of(resolved.name, resolved.model.name, resolved.served_name)
    return routing == "kv_events" and cfg.manager.runtime == "ray"


def apply_kv_events(cfg: StackConfig, resolved: ResolvedProfile, catalog: VllmCatalog, notes: list[str]) -> None:
    """kv_events_config and enable_prefix_caching for a model routed on its KV events; a profile's own
    kv_events_config keeps its other fields (buffer_steps, hwm), the endpoints are the stack's."""
    if not routes_on_kv_events(cfg, resolved):
        return
    where = f"gateway.replica_routing: kv_events for {resolved.served_name}"
    if OPTION not in catalog:
        raise ConfigError(
            f"{where}: this vLLM ({catalog.distribution} {catalog.version}) has no {FLAG}",
            hint="route this model's replicas with prefix_affinity (gateway.replica_routing_models)",
        )
    if resolved.engine.get("enable_prefix_caching") is False:
        raise ConfigError(
            f"{where}, but its engine.enable_prefix_caching is false: no blocks would be cached to route on",
            hint="drop enable_prefix_caching: false, or route it with least_outstanding",
        )
    own = resolved.engine.get(OPTION)
    if isinstance(own, str):
        own = json.loads(own)
    ours = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": PLACEHOLDER,
            "replay_endpoint": PLACEHOLDER_REPLAY, "topic": "kv"}  # fmt: skip
    resolved.engine[OPTION] = {**(own or {}), **ours}
    resolved.engine_origins[OPTION] = f"{where} (each replica's endpoints are picked at its start)"
    if "enable_prefix_caching" in catalog and "enable_prefix_caching" not in resolved.engine:
        resolved.engine["enable_prefix_caching"] = True
        resolved.engine_origins["enable_prefix_caching"] = where
    notes.append("kv_events: each replica publishes its KV events; the gateway routes on the prefix it holds")


def publishes(argv: list[str]) -> bool:
    return FLAG in argv


def with_endpoints(argv: list[str], endpoint: str, replay: str) -> list[str]:
    """`argv` with its --kv-events-config's endpoints set to this replica's."""
    out = list(argv)
    i = out.index(FLAG)
    config: dict[str, Any] = json.loads(out[i + 1])
    config.update(endpoint=endpoint, replay_endpoint=replay)
    out[i + 1] = json.dumps(config, separators=(",", ":"))
    return out
