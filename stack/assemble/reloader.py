"""`vstack reload` inside the running gateway (POST /admin/reload): plan again, restart what changed."""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from stack.assemble.planning import Launch, plan_up
from stack.assemble.runtimes import runtime_pair
from stack.config.schema import StackConfig
from stack.engine.kept import (
    tree_pids,
)
from stack.errors import StackError
from stack.hardware import detect
from stack.planner.plans import StackPlan

if TYPE_CHECKING:  # the gateway's modules (FastAPI, LiteLLM: seconds) load only once the engine has started
    from stack.gateway.engines import EngineSupervisor


class Reloader:
    """`vstack reload` inside the running gateway: the configuration read again and planned; an engine whose
    fingerprint (ModelPlan.fingerprint) changed is drained, stopped and started from its new plan in the
    background, while every other engine keeps serving. Models added or removed, gateway settings and
    other runtimes than local processes are not changed by a reload: it says so."""

    def __init__(self, launch: Launch, sup: EngineSupervisor, profile: str | None,
                 config: str | None) -> None:  # fmt: skip
        self.launch, self.sup, self.profile, self.config = launch, sup, profile, config
        self._lock = asyncio.Lock()
        # `engine_python` given to POST /admin/reload (`vstack upgrade apply`): kept for later reloads.
        self.overrides: dict[str, str] = {}

    async def __call__(self, engine_python: str | None = None) -> dict:
        from stack.gateway.openai_errors import InvalidRequest

        async with self._lock:
            try:
                if engine_python is not None:
                    self.overrides["engine_python"] = allowed_engine_python(engine_python, self.launch.cfg)
                new = await asyncio.to_thread(self._plan)
            except StackError as exc:  # nothing was changed: the running engines keep serving
                raise InvalidRequest(f"reload: {exc.message}" + (f" ({exc.hint})" if exc.hint else ""),
                                     param=None) from None  # fmt: skip
            return self._apply(new)

    def _plan(self) -> StackPlan:
        from stack.config import load_config
        from stack.errors import ConfigError

        # the command line's overrides (--force) apply again, and an engine Python `vstack upgrade apply` gave
        overrides = {**(self.launch.plan.overrides or {}), **self.overrides} or None
        cfg = load_config(self.config, overrides=overrides)  # a reload reads the configuration again: its purpose
        if cfg.manager.runtime != "local":
            raise ConfigError(f"manager.runtime: {cfg.manager.runtime}: reload restarts local engine processes only",
                              hint="`vstack down && vstack up`")  # fmt: skip
        running = set().union(*(tree_pids(pid) for s in self.sup.manager.slots.values()
                                if (pid := getattr(s.runtime, "pid", None))))  # fmt: skip
        return plan_up(cfg, self.profile, on_status=lambda m: logging.getLogger("stack.gateway").info("%s", m),
                       hardware=detect(frozenset(running)), overrides=overrides)  # fmt: skip

    def _apply(self, new: StackPlan) -> dict:
        from stack.manager.memory import engine_need, engine_weights

        manager, log = self.sup.manager, logging.getLogger("stack.gateway")
        plans = {p.served_name: p for p in new.models}
        kept, restarted = [], []
        not_applied = [f"{n}: added; a new model needs `vstack down && vstack up`" for n in plans
                       if n not in manager.slots]  # fmt: skip
        not_applied += [f"{n}: removed from the configuration; still served until `vstack down`"
                        for n in manager.slots if n not in plans]  # fmt: skip
        if new.config.gateway != self.launch.cfg.gateway:
            not_applied.append("gateway settings changed: they apply on the next `vstack up`")
        applied = Launch(new, handoff=self.launch.handoff)
        for name, plan in plans.items():
            slot = manager.slots.get(name)
            if slot is None:
                continue
            if getattr(slot.runtime, "fingerprint", None) == plan.fingerprint:
                kept.append(name)
                continue
            _engine, slot.factory = runtime_pair(applied, plan, kept=False)
            slot.need, slot.need_source = engine_need(plan.fit)
            slot.weights_gpu, slot.weights_host = engine_weights(plan.fit)
            restarted.append(name)
            task = asyncio.get_running_loop().create_task(self._restart(name), name=f"reload {name}")
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self.launch = replace(self.launch, plan=self.launch.plan.model_copy(update={"config": new.config}))
        log.info("reload: kept %s; restarting %s%s", kept or "none", restarted or "none",
                 f"; not applied: {not_applied}" if not_applied else "")  # fmt: skip
        return {"kept": kept, "restarted": restarted, "not_applied": not_applied}

    async def _restart(self, name: str) -> None:
        from stack.manager.states import ModelState

        manager = self.sup.manager
        slot = manager.slots[name]
        was_up = slot.state in (ModelState.READY, ModelState.STARTING, ModelState.SLEEPING)
        await manager.unload(name)  # drains its in-flight requests, then stops it
        if was_up:
            manager.request_switch(name, force=True)


def allowed_engine_python(python: str, cfg: StackConfig) -> str:
    """A reload may move engines only to a Python the stack knows: the configured one, or a candidate venv that
    `vstack upgrade check` built under cache_dir/upgrade/venvs (the admin API never runs an arbitrary program)."""
    from stack.errors import ConfigError
    from stack.vllm.cache_root import absolute, candidate_venvs

    path, venvs = absolute(python), absolute(candidate_venvs(cfg.cache_dir))
    known = {absolute(p) for p in (cfg.engine_python, sys.executable) if p}
    inside = venvs in path.parents and path.parent.name == "bin" and path.name.startswith("python")
    if (path in known or inside) and path.is_file():
        return python
    raise ConfigError(
        f"engine_python {python!r}: not the configured engine Python nor a candidate venv under {venvs}",
        hint="build one with `vstack upgrade check VERSION`",
    )
