"""What the model manager needs from an engine, whichever way it runs.

`Runtime` is satisfied by `LocalEngine` (a child process, below) and by
stack.engine.docker_runtime.DockerEngine (a container). Blocking calls: the manager runs them in threads.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import httpx

from stack.engine.diagnose import log_tail
from stack.engine.process import EngineProcess, EngineSpec
from stack.errors import EngineError


@runtime_checkable
class Runtime(Protocol):
    spec: Any  # .name, and .base_url: where the gateway reaches the engine

    def start(self) -> int: ...
    def wait_ready(self, timeout: float) -> float: ...
    def stop(self, grace: float = 20) -> list[int]: ...
    def exit_code(self) -> int | None: ...
    def sleep(self, level: int = 1, timeout: float = 120) -> None: ...
    def wake_up(self, tags: list[str] | None = None, timeout: float = 120) -> None: ...
    def is_sleeping(self) -> bool: ...
    def logs(self, lines: int = 40) -> str: ...


class SleepEndpoints:
    """vLLM's sleep endpoints, for any runtime whose `spec` has a name and a base_url. They exist only with
    --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1: never where more than the gateway can reach them."""

    spec: Any

    def sleep(self, level: int = 1, timeout: float = 120) -> None:
        control_post(self.spec.base_url, self.spec.name, "/sleep", {"level": str(level)}, timeout)

    def wake_up(self, tags: list[str] | None = None, timeout: float = 120) -> None:
        control_post(self.spec.base_url, self.spec.name, "/wake_up", {"tags": tags} if tags else {}, timeout)

    def is_sleeping(self) -> bool:
        resp = httpx.get(f"{self.spec.base_url}/is_sleeping", timeout=10)
        resp.raise_for_status()
        return bool(resp.json().get("is_sleeping"))


class LocalEngine(SleepEndpoints, EngineProcess):
    """EngineProcess plus vLLM's sleep endpoints (which is why the engine must stay on loopback)."""

    def logs(self, lines: int = 40) -> str:
        return log_tail(self.spec.log_path, lines)


def logs_of(runtime: object, lines: int = 40) -> str:
    """The end of an engine's log, from any runtime (a plain EngineProcess has only its log file)."""
    logs = getattr(runtime, "logs", None)
    if callable(logs):
        return str(logs(lines))
    spec = getattr(runtime, "spec", None)
    return log_tail(spec.log_path, lines) if spec is not None and hasattr(spec, "log_path") else ""


def control_post(base_url: str, name: str, path: str, params: dict[str, Any], timeout: float) -> None:
    """POST to one of vLLM's sleep endpoints; anything but 200 is an EngineError saying what the engine needs."""
    try:
        resp = httpx.post(f"{base_url}{path}", params=params, timeout=timeout)
    except httpx.HTTPError as exc:
        raise EngineError(f"engine {name!r}: POST {path} failed: {type(exc).__name__}") from exc
    if resp.status_code != 200:
        raise EngineError(
            f"engine {name!r}: POST {path} answered {resp.status_code}: {resp.text[:200]}",
            hint="sleep mode needs --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 on the engine (GPU only)",
        )


def with_port(spec: EngineSpec, port: int) -> EngineSpec:
    """The same engine on another port: each cold start takes a port that is free now."""

    def swap(argv: list[str]) -> list[str]:
        out = list(argv)
        for i, arg in enumerate(out[:-1]):
            if arg == "--port":
                out[i + 1] = str(port)
        return out

    return dataclasses.replace(spec, port=port, argv=swap(spec.argv), display_argv=swap(spec.display_argv))
