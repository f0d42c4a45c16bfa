"""Proof of progress for local engines (adr/0021-health-progress-and-aborts.md).

A stopped engine (SIGSTOP, a wedged engine core, a GPU hang) keeps its port and process: only a deadline
tells it apart from a busy one. Each ready local engine is probed every `probe_interval_s`:

- `/health` must answer 200 within `probe_timeout_s` (vLLM's checks its engine core); `probe_failures`
  failures in a row make it unresponsive;
- while requests are in flight on it, tokens must come: a chunk on one of its streams, or growth of its
  own `vllm:prompt_tokens` / `vllm:generation_tokens` counters. None for `stall_s`: stalled, unresponsive.

An unresponsive engine's deployment leaves routing and /ready (state `unresponsive`, with the reason); the
requests waiting on it are cut at once (`guard`): one that has streamed nothing yet goes to its fallback
like any failed attempt, else its stream ends with an error event that says why. The probes go on, and the
engine is `ready` again once it answers (and, after a stall, once its counters move or it is idle).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from stack.config.sections.gateway import EngineLiveness
from stack.gateway.openai_errors import UpstreamError
from stack.gateway.registry import Deployment, DeploymentRegistry

log = logging.getLogger("stack.gateway.liveness")
UNRESPONSIVE = "unresponsive"
PROGRESS = ("vllm:prompt_tokens", "vllm:generation_tokens")  # counters (their _total samples)
RUNNING = ("vllm:num_requests_running", "vllm:num_requests_waiting")


class EngineStalled(UpstreamError):
    """The engine was found unresponsive while this request waited on it: fall back, or fail with 503."""

    def __init__(self, dep_id: str, why: str) -> None:
        super().__init__(f"engine {dep_id} stopped making progress ({why})", status=503, reason="stalled")


@dataclass
class Health:
    failures: int = 0
    why: str = ""  # set while unresponsive
    stalled: bool = False  # unresponsive for want of tokens (not for want of /health)
    tokens: float | None = None  # the engine's token counters at the last probe
    busy: float = 0.0  # requests running or waiting, by the engine's own gauges
    last_progress: float = field(default_factory=time.monotonic)
    guards: set[asyncio.Timeout] = field(default_factory=set)  # waits for an answer's start, cut by rescheduling
    streams: set[aiohttp.ClientResponse] = field(default_factory=set)  # streams being relayed, cut by closing


class Liveness:
    def __init__(self, settings: EngineLiveness, registry: DeploymentRegistry, in_flight: dict[str, int],
                 metrics_registry: CollectorRegistry) -> None:  # fmt: skip
        self.settings = settings
        self.registry = registry
        self.in_flight = in_flight  # requests in flight per deployment (the gateway's own count)
        self.health: dict[str, Health] = {}
        self.stalls = Counter("vstack_gateway_engine_unresponsive", "Times a local engine was found unresponsive, "
                              "by reason (probe: no /health in time; stall: no token)", ["deployment", "reason"],
                              registry=metrics_registry)  # fmt: skip
        self._session: aiohttp.ClientSession | None = None
        registry.subscribe(self._on_change)

    # -- the request path -----------------------------------------------------------------------------------
    def _of(self, dep_id: str) -> Health:
        health = self.health.get(dep_id)
        if health is None:
            health = self.health[dep_id] = Health()
        return health

    def begin(self, dep_id: str) -> None:
        """A request starts on it: an idle engine's silence until now is no stall."""
        if not self.in_flight.get(dep_id):
            self._of(dep_id).last_progress = time.monotonic()

    def progress(self, dep_id: str) -> None:
        """A token came (a stream chunk). Called per chunk: one dict lookup and a clock read."""
        health = self.health.get(dep_id)
        if health is not None:
            health.last_progress = time.monotonic()

    def attach(self, dep_id: str, resp: aiohttp.ClientResponse) -> None:
        """A stream is relayed from it: closed at once if the engine is found unresponsive."""
        self._of(dep_id).streams.add(resp)

    def detach(self, dep_id: str, resp: aiohttp.ClientResponse) -> None:
        health = self.health.get(dep_id)
        if health is not None:
            health.streams.discard(resp)

    def why(self, dep_id: str) -> str:
        """Why it is unresponsive; "" while it is not."""
        health = self.health.get(dep_id)
        return health.why if health is not None else ""

    @contextlib.asynccontextmanager
    async def guard(self, dep_id: str) -> AsyncIterator[None]:
        """Around one wait on the engine: EngineStalled at once if it is (or is found) unresponsive."""
        health = self._of(dep_id)
        if health.why:
            raise EngineStalled(dep_id, health.why)
        try:
            async with asyncio.timeout(None) as deadline:
                health.guards.add(deadline)
                try:
                    yield
                finally:
                    health.guards.discard(deadline)
        except TimeoutError:
            if deadline.expired() and health.why:
                raise EngineStalled(dep_id, health.why) from None
            raise

    # -- the watch ------------------------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            deps = [d for d in self.registry.all() if d.kind == "local" and d.api_base and d.routable
                    and d.state in ("ready", UNRESPONSIVE)]  # fmt: skip
            await asyncio.gather(*(self.check(d) for d in deps), return_exceptions=True)
            await asyncio.sleep(self.settings.probe_interval_s)

    async def check(self, dep: Deployment) -> None:
        """One probe of one engine: /health in time, then its counters; mark or clear it."""
        health = self._of(dep.id)
        timeout = aiohttp.ClientTimeout(total=self.settings.probe_timeout_s)
        session = self._client()
        try:
            async with session.get(f"{dep.api_base}/health", timeout=timeout) as resp:
                ok = resp.status == 200
                why = f"/health answered {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            ok, why = False, (f"no /health answer within {self.settings.probe_timeout_s:g} s"
                              if isinstance(exc, TimeoutError) else f"/health failed: {type(exc).__name__}")
        if not ok:
            health.failures += 1
            if health.failures >= self.settings.probe_failures:
                self._unresponsive(dep, health, f"{why}, {health.failures} probes in a row", "probe")
            return
        health.failures = 0
        moved = await self._counters(session, dep, health, timeout)
        now = time.monotonic()
        if moved:
            health.last_progress = now
        waiting = self.in_flight.get(dep.id, 0) or health.busy > 0
        silent = now - health.last_progress
        if waiting and silent >= self.settings.stall_s:
            self._unresponsive(dep, health, f"no token for {silent:.0f} s with requests in flight", "stall")
            health.stalled = True
        elif health.why and (not health.stalled or moved or not waiting):
            self._recovered(dep, health)

    async def _counters(self, session: aiohttp.ClientSession, dep: Deployment, health: Health,
                        timeout: aiohttp.ClientTimeout) -> bool:  # fmt: skip
        """Read the engine's token counters and busy gauges; True when the counters grew since last time.
        An engine without vLLM's metrics is judged by its streams' chunks alone."""
        try:
            async with session.get(f"{dep.api_base}/metrics", timeout=timeout) as resp:
                text = (await resp.read()).decode(errors="replace") if resp.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError):
            return False
        tokens, busy, seen = 0.0, 0.0, False
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in (f"{n}_total" for n in PROGRESS):
                    tokens, seen = tokens + sample.value, True
                elif sample.name in RUNNING:
                    busy += sample.value
        if not seen:
            return False
        before, health.tokens, health.busy = health.tokens, tokens, busy
        return before is not None and tokens > before

    def _unresponsive(self, dep: Deployment, health: Health, why: str, reason: str) -> None:
        if not health.why:
            health.why = why
            self.stalls.labels(dep.id, reason).inc()
            log.error("engine %s is unresponsive: %s; out of routing until it answers again", dep.id, why)
        if dep.state == "ready":  # (again, if the manager wrote `ready` over it meanwhile)
            self.registry.set_state(dep.id, UNRESPONSIVE, health.why)
        _cut(health)

    def _recovered(self, dep: Deployment, health: Health) -> None:
        log.warning("engine %s answers again (it was unresponsive: %s)", dep.id, health.why)
        health.why, health.stalled, health.failures = "", False, 0
        health.last_progress = time.monotonic()
        if dep.state == UNRESPONSIVE:
            self.registry.set_state(dep.id, "ready", "answering again")

    def _on_change(self, dep_id: str, before: Deployment | None, after: Deployment | None) -> None:
        # The manager moved it (restart, stop, a new engine on a new port): what we knew no longer holds.
        if after is None or (after.state != UNRESPONSIVE and (before is None or before.api_base != after.api_base
                                                               or after.state != "ready")):
            self.health.pop(dep_id, None)

    def unresponsive(self) -> dict[str, str]:
        return {dep_id: h.why for dep_id, h in self.health.items() if h.why}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _cut(health: Health) -> None:
    """End every wait on the engine now: waits for an answer raise EngineStalled, relayed streams see their
    connection closed (which is also what makes vLLM abort them once it runs again)."""
    loop = asyncio.get_running_loop()
    for deadline in list(health.guards):
        with contextlib.suppress(RuntimeError):  # it is expiring already
            deadline.reschedule(loop.time())
    for resp in list(health.streams):
        resp.close()
    health.streams.clear()
