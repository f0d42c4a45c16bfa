"""From a ModelPlan (stack.planner.plans) to a process to start: the EngineSpec, its port and its log.

The plan decided everything the engine serves; a start only adds what belongs to that one start: a free
loopback port (when the plan's port is 0), a fresh engine key only the gateway holds, and the sleep
handoff's socket when the gateway opened one.
"""

from __future__ import annotations

import socket
from pathlib import Path

from stack.config.schema import StackConfig
from stack.engine.process import EngineSpec
from stack.engine_env import new_engine_key
from stack.planner.plans import ModelPlan
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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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
