"""LoRA adapters served on their base model's engine (adr/0013-model-families-and-adapters.md).

A client asks for an adapter by name like a model. The request goes to the base model's group (the model
manager sees one engine: no switch between a base and its adapters) and to the engine with the adapter's
name; the adapter is loaded into that engine on its first request through vLLM's runtime API
(/v1/load_lora_adapter). Each engine keeps at most `max_cpu_loras` adapters loaded: loading one more
unloads the least recently used idle one (/v1/unload_lora_adapter). Inside the engine vLLM keeps at most
`max_loras` of them in a batch, swapping by its own LRU. Loads, evictions, refusals and requests are
counted per adapter.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from prometheus_client import CollectorRegistry, Counter

from stack.gateway.errors import InvalidRequest, UpstreamError
from stack.gateway.registry import Deployment, DeploymentRegistry


@dataclass
class Adapter:
    name: str
    base: str  # the base model's group
    path: str
    rank: int = 0
    source: dict[str, Any] = field(default_factory=dict)
    in_flight: int = 0


@dataclass
class Base:
    """A model group whose engine was started with LoRA enabled."""

    group: str
    max_lora_rank: int
    max_loras: int
    max_cpu_loras: int
    runtime_updates: bool = True
    model: Any = None  # stack.config.schema.ModelEntry, for the base-model check of adapters added at runtime


class AdapterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["adapter", "model"]
        self.requests = Counter("vstack_adapter_requests", "Requests for each LoRA adapter", labels, registry=registry)
        self.loads = Counter("vstack_adapter_loads", "Adapters loaded into an engine", labels, registry=registry)
        self.evictions = Counter("vstack_adapter_evictions", "Adapters unloaded to make room (least recently used)",
                                 labels, registry=registry)  # fmt: skip
        self.refused = Counter("vstack_adapter_load_failures", "Adapters an engine refused to load", labels,
                               registry=registry)  # fmt: skip


class AdapterBook:
    """Every adapter the gateway serves, and which are loaded in which engine (most recent last)."""

    def __init__(self, registry: DeploymentRegistry, metrics_registry: CollectorRegistry) -> None:
        self.adapters: dict[str, Adapter] = {}
        self.bases: dict[str, Base] = {}
        self.metrics = AdapterMetrics(metrics_registry)
        self._loaded: dict[str, OrderedDict[str, None]] = {}  # deployment id -> adapter names
        self._locks: dict[str, asyncio.Lock] = {}
        self._session: aiohttp.ClientSession | None = None
        registry.subscribe(self._on_change)

    # -- what is served ---------------------------------------------------------------------------
    def add_base(self, base: Base) -> None:
        self.bases[base.group] = base

    def add(self, adapter: Adapter) -> Adapter:
        if adapter.base not in self.bases:
            raise InvalidRequest(f"model `{adapter.base}` runs without LoRA: add `adapters:` (or `lora:`) to its "
                                 "model config and restart it", param="base")  # fmt: skip
        if adapter.name in self.adapters or adapter.name in self.bases:
            raise InvalidRequest(f"`{adapter.name}` is served already; remove it first", param="name")
        self.adapters[adapter.name] = adapter
        return adapter

    def lookup(self, model: str) -> Adapter | None:
        return self.adapters.get(model)

    def loaded(self, dep_id: str) -> list[str]:
        return list(self._loaded.get(dep_id, {}))

    def cards(self, groups: set[str]) -> dict[str, str]:
        """Adapter name -> base group, for /v1/models (adapters of listed groups)."""
        return {a.name: a.base for a in self.adapters.values() if a.base in groups}

    def _on_change(self, dep_id: str, before: Deployment | None, after: Deployment | None) -> None:
        # A stopped or restarted engine has forgotten its adapters: load them again on their next request.
        if after is None or after.state != "ready" or (before is not None and before.api_base != after.api_base):
            self._loaded.pop(dep_id, None)

    # -- one request ------------------------------------------------------------------------------
    async def acquire(self, dep: Deployment, adapter: Adapter) -> None:
        """Make sure the adapter is loaded in this engine, evicting the least recently used idle one
        past max_cpu_loras. Raises InvalidRequest with the engine's reason when it refuses the adapter."""
        base = self.bases[adapter.base]
        lock = self._locks.setdefault(dep.id, asyncio.Lock())
        async with lock:
            loaded = self._loaded.setdefault(dep.id, OrderedDict())
            if adapter.name in loaded:
                loaded.move_to_end(adapter.name)
            else:
                while len(loaded) >= base.max_cpu_loras:
                    victim = next((n for n in loaded if self._idle(n)), None)
                    if victim is None:
                        break  # every loaded adapter is answering: vLLM's own LRU bounds its memory
                    await self._call(dep, "/v1/unload_lora_adapter", {"lora_name": victim})
                    loaded.pop(victim)
                    self.metrics.evictions.labels(victim, adapter.base).inc()
                await self._load(dep, adapter)
                loaded[adapter.name] = None
            adapter.in_flight += 1
        self.metrics.requests.labels(adapter.name, adapter.base).inc()

    def release(self, adapter: Adapter) -> None:
        adapter.in_flight = max(0, adapter.in_flight - 1)

    def _idle(self, name: str) -> bool:
        adapter = self.adapters.get(name)
        return adapter is None or adapter.in_flight == 0

    async def _load(self, dep: Deployment, adapter: Adapter) -> None:
        status, body = await self._call(dep, "/v1/load_lora_adapter",
                                        {"lora_name": adapter.name, "lora_path": adapter.path}, check=False)
        if status == 400 and b"already been loaded" in body:
            return  # loaded before we knew it (a gateway restart): fine
        if status >= 400:
            self.metrics.refused.labels(adapter.name, adapter.base).inc()
            raise InvalidRequest(f"the engine of `{adapter.base}` refused adapter `{adapter.name}`: "
                                 f"{_reason(body)}", param="model", code="adapter_load_failed")  # fmt: skip
        self.metrics.loads.labels(adapter.name, adapter.base).inc()

    async def unload_everywhere(self, name: str, registry: DeploymentRegistry) -> None:
        for dep_id, loaded in self._loaded.items():
            dep = registry.get(dep_id)
            if name in loaded and dep is not None:
                await self._call(dep, "/v1/unload_lora_adapter", {"lora_name": name}, check=False)
                loaded.pop(name)

    async def _call(self, dep: Deployment, path: str, payload: dict, check: bool = True) -> tuple[int, bytes]:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        try:
            headers = {"Content-Type": "application/json", **dep.auth()}
            async with self._session.post(f"{dep.api_base}{path}", data=orjson.dumps(payload), headers=headers) as resp:
                body = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError(f"{dep.id} is not reachable for {path}", status=502, reason="connect") from exc
        if check and resp.status >= 400:
            raise UpstreamError(f"{dep.id} answered {resp.status} to {path}: {_reason(body)}", status=502)
        return resp.status, body

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _reason(body: bytes) -> str:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace")[:300]
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        return str(err.get("message", err))[:500]
    return str(obj.get("detail", obj) if isinstance(obj, dict) else obj)[:500]


def adapter_from_info(info: Any, base: str) -> Adapter:
    """An Adapter from stack.vllm.lora.AdapterInfo."""
    return Adapter(info.name, base, str(Path(info.path).resolve()), info.rank, dict(info.source))
