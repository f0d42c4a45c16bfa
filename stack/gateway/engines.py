"""The gateway owns its engines: start them, register each as a deployment when ready, watch, stop.

An engine is registered as `starting` at once (requests for its model get 503 + Retry-After, not 404),
`ready` after /health answers, `failed` when it exits or never comes up. Blocking process work
(EngineProcess.start / wait_ready / stop) runs in threads so the gateway keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Protocol

from stack.errors import EngineError
from stack.gateway.registry import Deployment, DeploymentRegistry
from stack.gateway.state import GatewayState

log = logging.getLogger("stack.gateway.engines")


class Engine(Protocol):
    """What stack.engine.process.EngineProcess offers (spec.name, spec.base_url, start/wait_ready/stop)."""

    spec: object

    def start(self) -> int: ...
    def exit_code(self) -> int | None: ...
    def wait_ready(self, timeout: float) -> float: ...
    def stop(self, grace: float = 20) -> list[int]: ...


@dataclass
class ManagedEngine:
    engine: Engine
    model_group: str  # the name clients ask for (the model's api_name)
    served_name: str  # what the engine calls it (--served-model-name)
    deployment_id: str = ""
    task: asyncio.Task | None = field(default=None, repr=False)


class EngineSupervisor:
    def __init__(self, engines: list[ManagedEngine], startup_timeout_s: float, stop_grace_s: float) -> None:
        self.engines = engines
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self._stopping = False

    async def start(self, state: GatewayState) -> None:
        """on_startup hook: register every engine as starting and bring them up in the background."""
        for m in self.engines:
            m.deployment_id = m.deployment_id or f"engine-{m.model_group}"
            spec = m.engine.spec
            state.registry.add(Deployment(
                id=m.deployment_id, model_group=m.model_group, kind="local", upstream_model=m.served_name,
                api_base=spec.base_url, state="starting", labels={"engine": spec.name},
            ))  # fmt: skip
            m.task = asyncio.create_task(self._run(m, state.registry), name=f"engine {spec.name}")

    async def _run(self, m: ManagedEngine, registry: DeploymentRegistry) -> None:
        try:
            pid = await asyncio.to_thread(m.engine.start)
            registry.set_state(m.deployment_id, "starting", f"pid {pid}")
            seconds = await asyncio.to_thread(m.engine.wait_ready, self.startup_timeout_s)
        except EngineError as exc:
            log.error("engine %s failed to start: %s", m.engine.spec.name, exc.message)
            registry.set_state(m.deployment_id, "failed", exc.message)
            return
        registry.set_state(m.deployment_id, "ready", f"pid {pid}, ready in {seconds:.0f} s")
        log.info("engine %s ready in %.0f s", m.engine.spec.name, seconds)
        while not self._stopping:  # watch: an engine that dies leaves the Router at once
            code = m.engine.exit_code()
            if code is not None:
                log.error("engine %s exited with code %s", m.engine.spec.name, code)
                registry.set_state(m.deployment_id, "failed", f"exited with code {code}")
                return
            await asyncio.sleep(1)

    async def stop(self, state: GatewayState) -> None:
        """on_shutdown hook (after uvicorn drained the in-flight requests): stop every engine."""
        self._stopping = True
        for m in self.engines:
            if m.task is not None:
                m.task.cancel()
            state.registry.set_state(m.deployment_id, "stopped", "gateway shutting down")
        await asyncio.gather(*(asyncio.to_thread(m.engine.stop, self.stop_grace_s) for m in self.engines))
