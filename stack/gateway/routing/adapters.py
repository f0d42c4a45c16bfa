"""LoRA adapters served on their base model's engine (adr/0013-model-families-and-adapters.md).

A client asks for an adapter by name like a model. The request goes to the base model's group (the model
manager sees one engine: no switch between a base and its adapters) and to the engine with the adapter's
name; the adapter is loaded into that engine on its first request through vLLM's runtime API
(/v1/load_lora_adapter). Each engine keeps at most `max_cpu_loras` adapters loaded: loading one more
unloads the least recently used idle one (/v1/unload_lora_adapter). Inside the engine vLLM keeps at most
`max_loras` of them in a batch, swapping by its own LRU. Loads, evictions, refusals and requests are
counted per adapter served now (a removed adapter's series go with it: the label set stays bounded).

One tenant's adapter must not change what the base model answers everyone else (adr/0020): weights are
checked before loading (stack.vllm.lora.check_weights), and after each load or unload a golden prompt
(temperature 0) must still get the answer the untouched engine gave. If not, the adapter just loaded is
dropped, the engine is marked failed (out of routing, /ready 503) and restarted by the model manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from prometheus_client import CollectorRegistry, Counter

from stack.gateway.openai_errors import InvalidRequest, UpstreamError
from stack.gateway.registry import Deployment, DeploymentRegistry

log = logging.getLogger("stack.gateway.adapters")
# The golden check: a fixed greedy prompt, short (a few decode steps per adapter action), asked of the base
# model when its engine is untouched and again after each adapter load or unload.
GOLDEN_MESSAGES = [{"role": "user", "content": "Count from one to five in words."}]
GOLDEN_TOKENS = 8
GOLDEN_TRIES = 3  # a mismatch is confirmed twice more before the engine is called broken
OnCorrupt = Callable[[Deployment, str], Awaitable[None]]


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
        self.base_changed = Counter("vstack_adapter_base_check_failures", "Engines whose base model answered the "
                                    "golden prompt differently after an adapter load or unload (then restarted)",
                                    ["model"], registry=registry)  # fmt: skip

    def forget(self, adapter: str, model: str) -> None:
        """Drop a removed adapter's series: names tried and removed must not pile up in /metrics."""
        for counter in (self.requests, self.loads, self.evictions, self.refused):
            with contextlib.suppress(KeyError):
                counter.remove(adapter, model)


class AdapterBook:
    """Every adapter the gateway serves, and which are loaded in which engine (most recent last)."""

    def __init__(self, registry: DeploymentRegistry, metrics_registry: CollectorRegistry) -> None:
        self.adapters: dict[str, Adapter] = {}
        self.bases: dict[str, Base] = {}
        self.metrics = AdapterMetrics(metrics_registry)
        self._loaded: dict[str, OrderedDict[str, None]] = {}  # deployment id -> adapter names
        self._locks: dict[str, asyncio.Lock] = {}
        self._session: aiohttp.ClientSession | None = None
        self._golden: dict[str, str] = {}  # deployment id -> the untouched engine's answer to GOLDEN_MESSAGES
        self.registry = registry
        self.on_corrupt: OnCorrupt | None = None  # restarts the engine (the app wires the model manager in)
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
            self._golden.pop(dep_id, None)

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
                    await self._record_golden(dep)
                    await self._call(dep, "/v1/unload_lora_adapter", {"lora_name": victim})
                    loaded.pop(victim)
                    self.metrics.evictions.labels(victim, adapter.base).inc()
                    if not await self._verify(dep, f"unloading adapter `{victim}`"):
                        raise UpstreamError(f"{dep.id} is restarting: its base model changed", status=502)
                await self._record_golden(dep)
                await self._load(dep, adapter)
                loaded[adapter.name] = None
                if not await self._verify(dep, f"loading adapter `{adapter.name}`"):
                    self.adapters.pop(adapter.name, None)  # the suspect: not offered again
                    self.metrics.forget(adapter.name, adapter.base)
                    raise InvalidRequest(f"adapter `{adapter.name}` changed what the base model `{adapter.base}` "
                                         "answers; it was removed and the engine is restarting", param="model",
                                         code="adapter_rejected")  # fmt: skip
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
        for dep_id, loaded in list(self._loaded.items()):
            dep = registry.get(dep_id)
            if name in loaded and dep is not None:
                async with self._locks.setdefault(dep_id, asyncio.Lock()):
                    await self._record_golden(dep)
                    await self._call(dep, "/v1/unload_lora_adapter", {"lora_name": name}, check=False)
                    loaded.pop(name, None)
                    await self._verify(dep, f"unloading adapter `{name}`")

    # -- the golden check ---------------------------------------------------------------------------
    async def golden_answer(self, dep: Deployment) -> str:
        """The base model's greedy answer to GOLDEN_MESSAGES ("" when it answers nothing or fails)."""
        body = {"model": dep.upstream_model, "messages": GOLDEN_MESSAGES, "max_tokens": GOLDEN_TOKENS,
                "temperature": 0, "seed": 0}  # fmt: skip
        try:
            status, raw = await self._call(dep, "/v1/chat/completions", body, check=False)
            return str(orjson.loads(raw)["choices"][0]["message"]["content"] or "") if status == 200 else ""
        except (UpstreamError, orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            return ""

    async def _record_golden(self, dep: Deployment) -> None:
        """The untouched engine's answer, once per engine (before its first adapter action)."""
        if dep.id in self._golden or self._loaded.get(dep.id):
            return
        answer = await self.golden_answer(dep)
        if answer:
            self._golden[dep.id] = answer
        else:
            log.warning("deployment %s: the base model gave no answer to the golden prompt; not checked", dep.id)

    async def _verify(self, dep: Deployment, after: str) -> bool:
        """True when the base model still answers as before `after`; else the engine is marked failed and
        restarted (on_corrupt), so no one is served by a base model an adapter broke."""
        golden = self._golden.get(dep.id)
        if golden is None:
            return True
        answer = ""
        for attempt in range(GOLDEN_TRIES):
            answer = await self.golden_answer(dep)
            if answer == golden:
                return True
            if attempt + 1 < GOLDEN_TRIES:
                await asyncio.sleep(0.2)
        why = (f"the base model answered {answer[:60]!r} instead of {golden[:60]!r} after {after}; "
               "engine restarting")  # fmt: skip
        log.error("deployment %s: %s", dep.id, why)
        self.metrics.base_changed.labels(dep.model_group).inc()
        self._golden.pop(dep.id, None)
        self._loaded.pop(dep.id, None)
        self.registry.set_state(dep.id, "failed", why)
        if self.on_corrupt is not None:
            await self.on_corrupt(dep, why)
        return False

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
