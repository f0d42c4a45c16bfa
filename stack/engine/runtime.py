"""What the model manager needs from an engine, whichever way it runs.

`Runtime` is satisfied by `LocalEngine` (a child process, below), stack.engine.docker_runtime.DockerEngine
(a container) and stack.engine.attached.AttachedEngine (a server someone else runs). Every method but
`exit_code` blocks (HTTP calls, process waits): the manager runs them in threads.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import httpx

from stack.engine.control_client import control_client
from stack.engine.diagnose import log_tail
from stack.engine.process import EngineProcess, EngineSpec
from stack.errors import EngineError
from stack.vllm.plugins.host_copy import KEEP_WEIGHTS_METHOD, RELEASE_WEIGHTS_METHOD, STAGE_METHOD, STAGING_METHOD


class RuntimeSpec(Protocol):
    """What every runtime's spec tells: the engine's name and where the gateway reaches it."""

    @property
    def name(self) -> str: ...
    @property
    def base_url(self) -> str: ...


@runtime_checkable
class Runtime(Protocol):
    """One engine as the manager drives it. State it exposes: `exit_code()` (None while running) and
    `is_sleeping()`; everything else is a command that blocks until done or raises EngineError."""

    spec: RuntimeSpec  # its base_url may change on start (a container reached by IP)
    runtime_kind: str  # process, docker or attached: shown in the deployment's labels
    owns_process: bool  # False: the manager cannot stop it to free memory (an attached engine)

    def start(self) -> int:
        """Start it; returns at once with its pid (or container id hash). Blocks only on spawning."""
        ...

    def wait_ready(self, timeout: float) -> float:
        """Block until it answers /health; seconds waited. EngineError (with its log tail) if it exits or
        the timeout passes."""
        ...

    def stop(self, grace: float = 20) -> list[int]:
        """SIGTERM, wait up to `grace`, then SIGKILL; blocks until gone. Pids that would not exit."""
        ...

    def exit_code(self) -> int | None:
        """Its exit code once it ended, None while it runs or before it started. Never blocks long."""
        ...

    def sleep(self, level: int = 1, timeout: float = 120) -> None:
        """vLLM sleep mode; blocks until the engine confirms."""
        ...

    def wake_up(self, tags: list[str] | None = None, timeout: float = 120) -> None:
        """Undo `sleep`; blocks until the engine confirms (then wait_ready)."""
        ...

    def reload_weights(self, timeout: float = 600) -> None:
        """After a level-2 sleep and a wake of the weights: load them again from the model's files."""
        ...

    def host_copy_busy(self, timeout: float = 10) -> bool:
        """True while the engine still stages its host buffers (or sleeps or wakes); False once idle or when it
        cannot say (SleepEndpoints.host_copy_busy)."""
        ...

    def is_sleeping(self) -> bool: ...

    def logs(self, lines: int = 40) -> str:
        """The end of its log, for errors and /admin/models."""
        ...


class SleepEndpoints:
    """vLLM's sleep endpoints, for any runtime whose `spec` has a name and a base_url. They exist only with
    --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1: never where more than the gateway can reach them."""

    spec: Any

    def sleep(self, level: int = 1, timeout: float = 120) -> None:
        control_post(self.spec.base_url, self.spec.name, "/sleep", {"level": str(level)}, timeout,
                     key=engine_key(self))  # fmt: skip

    def wake_up(self, tags: list[str] | None = None, timeout: float = 120) -> None:
        control_post(self.spec.base_url, self.spec.name, "/wake_up", {"tags": tags} if tags else {}, timeout,
                     key=engine_key(self))  # fmt: skip

    def reload_weights(self, timeout: float = 600) -> None:
        # vLLM's level-2 recipe: wake_up(tags=["weights"]), collective_rpc("reload_weights"), wake the KV cache.
        control_post(self.spec.base_url, self.spec.name, "/collective_rpc", {}, timeout,
                     body={"method": "reload_weights"}, key=engine_key(self))  # fmt: skip

    def stage_host_copy(self, timeout: float = 30) -> None:
        """Have the engine allocate (and where kept, fill) its first sleep's host buffers in the background
        (runtime patch gpu-sleep-wake-at-bus-speed); answers once the engine has started doing so."""
        control_post(self.spec.base_url, self.spec.name, "/collective_rpc", {}, timeout,
                     body={"method": STAGE_METHOD})  # fmt: skip

    def keep_weights_mapped(self, timeout: float = 30) -> None:
        """Have the engine's next sleep leave its weights mapped and release only the KV cache (runtime patch
        gpu-sleep-wake-at-bus-speed; manager.sleep_keeps_weights, adr/0058)."""
        control_post(self.spec.base_url, self.spec.name, "/collective_rpc", {}, timeout,
                     body={"method": KEEP_WEIGHTS_METHOD}, key=engine_key(self))  # fmt: skip

    def release_kept_weights(self, timeout: float = 60) -> None:
        """Have a sleeping engine that kept its weights mapped release them now, its host copy taken where it has
        none (runtime patch gpu-sleep-wake-at-bus-speed; another model needs the memory): it stays asleep."""
        control_post(self.spec.base_url, self.spec.name, "/collective_rpc", {}, timeout,
                     body={"method": RELEASE_WEIGHTS_METHOD}, key=engine_key(self))  # fmt: skip

    def host_copy_busy(self, timeout: float = 10) -> bool:
        """True while the engine still stages its host buffers (or sleeps or wakes); False once idle, and also
        when it cannot say (an engine without the runtime patch): a sleep then simply waits for the engine."""
        try:
            resp = control_client().post(f"{self.spec.base_url}/collective_rpc", json={"method": STAGING_METHOD},
                                         headers=auth_header(engine_key(self)), timeout=timeout)  # fmt: skip
            return resp.status_code == 200 and "busy" in (resp.json().get("results") or [])
        except (httpx.HTTPError, ValueError, AttributeError):
            return False

    def is_sleeping(self) -> bool:
        resp = control_client().get(f"{self.spec.base_url}/is_sleeping", headers=auth_header(engine_key(self)),
                                    timeout=10)  # fmt: skip
        resp.raise_for_status()
        return bool(resp.json().get("is_sleeping"))


class LocalEngine(SleepEndpoints, EngineProcess):
    """EngineProcess plus vLLM's sleep endpoints (which is why the engine must stay on loopback)."""

    def logs(self, lines: int = 40) -> str:
        return log_tail(self.spec.log_path, lines, self.log_start)


def logs_of(runtime: object, lines: int = 40) -> str:
    """The end of an engine's log, from any runtime (a plain EngineProcess has only its log file)."""
    logs = getattr(runtime, "logs", None)
    if callable(logs):
        return str(logs(lines))
    spec = getattr(runtime, "spec", None)
    start = getattr(runtime, "log_start", 0)
    return log_tail(spec.log_path, lines, start) if spec is not None and hasattr(spec, "log_path") else ""


def engine_key(runtime: object) -> str | None:
    """The credential an engine we started answers (its spec's api_key); None for one we only attach to."""
    return getattr(getattr(runtime, "spec", None), "api_key", None)


def auth_header(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def control_post(base_url: str, name: str, path: str, params: dict[str, Any], timeout: float,
                 body: dict[str, Any] | None = None, key: str | None = None) -> None:  # fmt: skip
    """POST to one of vLLM's sleep endpoints; anything but 200 is an EngineError saying what the engine needs."""
    try:
        resp = control_client().post(f"{base_url}{path}", params=params, json=body, headers=auth_header(key),
                                     timeout=timeout)  # fmt: skip
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
