"""From a ModelPlan (stack.planner.plans) to a process to start: the EngineSpec, its port and its log.

The plan decided everything the engine serves; a start only adds what belongs to that one start: a free
loopback port (when the plan's port is 0), a fresh engine key only the gateway holds, and the sleep
handoff's socket when the gateway opened one.
"""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path
from typing import Any

from stack.config.schema import StackConfig
from stack.engine.ports import free_port
from stack.engine.process import EngineSpec
from stack.engine.records import engine_records
from stack.engine_env import engine_environ, new_engine_key
from stack.planner.plans import ModelPlan, StackPlan
from stack.vllm.plugins.handoff import SOCKET_ENV


def engine_spec(plan: ModelPlan, log_path: Path, name: str | None = None, port: int | None = None,
                handoff_socket: str | None = None) -> EngineSpec:  # fmt: skip
    """The process that serves `plan`, logging to `log_path`, on `port` (else the plan's, else a free one),
    with a fresh key only the gateway holds (or the profile's own engine.api_key, which vLLM would prefer to
    the variable)."""
    port = port or plan.port or free_port(plan.host)
    env = {**plan.env, **({SOCKET_ENV: handoff_socket} if handoff_socket and plan.handoff else {})}
    return EngineSpec(name=name or plan.served_name, profile=plan.profile, argv=plan.argv(port), env=env,
                      host=plan.host, port=port, log_path=log_path, display_argv=plan.display(port).split(" "),
                      api_key=plan.given_key() or new_engine_key(), drop_env=plan.drop_env)  # fmt: skip


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def log_path_for(cfg: StackConfig, plan: ModelPlan) -> Path:
    return cfg.state_dir / "logs" / f"{plan.served_name}.log"


def early_payload(plan: StackPlan, cfg: StackConfig) -> dict[str, Any] | None:
    """What the CLI hands the gateway process for an early spawn of the plan's default engine; None where the
    gateway must start it itself (see stack.engine.early_spawn's docstring)."""
    default = plan.default
    if plan.site is not None or plan.cluster is not None or default.handoff:
        return None
    record = engine_records(cfg.state_dir).get(default.served_name)
    if record is not None and record.alive():  # kept running or asleep: the gateway re-attaches it
        return None
    spec = engine_spec(default, log_path_for(cfg, default))
    return {
        "spec": spec_data(spec),
        "environ": engine_environ({**spec.env, "PYTHONUNBUFFERED": "1"}, spec.api_key, spec.drop_env),
    }


def spec_data(spec: EngineSpec) -> dict[str, Any]:
    """The spec as JSON data (EngineSpec(**data) with its Path and tuple back is the same spec)."""
    return {**dataclasses.asdict(spec), "log_path": str(spec.log_path), "drop_env": list(spec.drop_env)}
