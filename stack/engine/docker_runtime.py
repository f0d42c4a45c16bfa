"""Engines as Docker containers: what EngineProcess does for a child process, done through the Docker SDK.

Two halves, one per side of the Docker API:

- `DockerEngine` runs where the model manager runs (the gateway container, given the Docker socket, or a
  host): start / wait_ready / stop / exit_code like EngineProcess, plus sleep / wake_up over HTTP. The
  engine container joins an internal network under its own name; no port is ever published.
- `python -m stack.entrypoints.engine_container serve [PROFILE_OR_MODEL] [--port N]` runs inside the
  engine image (`ContainerSpec.command`): plan the engine with the vLLM installed there (validated by its
  own parser), make sure the model is in the cache volume, then exec vLLM on 0.0.0.0:N. Inside the
  container 0.0.0.0 is only the container's address on the internal network, which nothing outside that
  network reaches.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from stack.engine.diagnose import explain_failure
from stack.engine.runtime import SleepEndpoints
from stack.engine_env import ENGINE_KEY_ENV
from stack.errors import EngineError

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container

LABEL = "org.vllm-stack.engine"  # every engine container carries it: stale ones can be found and removed
CACHE_MOUNT = "/cache"  # the model cache volume: converted models, Hub downloads, vLLM's compile cache
CONFIG_MOUNT = "/etc/vstack/configs"
# What an engine container runs (the engine images' CMD names it too). A name, not a module object: the
# container's program is a composition root (stack/entrypoints/engine_container.py), above this layer;
# tests/test_children.py checks that it resolves.
CONTAINER_ENTRY = "stack.entrypoints.engine_container"
# The engine image's Python answers the healthcheck: no curl or wget in a slim image.
_HEALTH_CMD = ("import sys,urllib.request as u; "
               "sys.exit(u.urlopen('http://127.0.0.1:%d/health', timeout=3).status != 200)")
_NS = 1_000_000_000


def container_env(cache: str = CACHE_MOUNT) -> dict[str, str]:
    """Where an engine container keeps what outlives it: all of it on the cache volume."""
    return {
        "VSTACK_CACHE_DIR": cache,
        "VSTACK_STATE_DIR": f"{cache}/state",
        "HF_HOME": f"{cache}/huggingface",
        "VLLM_CACHE_ROOT": f"{cache}/vllm",
        "VSTACK_CONFIG_DIR": CONFIG_MOUNT,
    }


@dataclass
class ContainerSpec:
    """One engine container. `name` is the container's name and its DNS name on `network`."""

    name: str
    image: str
    serve: str  # a profile, or a model served on the hardware the container sees
    network: str
    port: int = 8000
    cache_volume: str = "vstack-models"  # a named volume (or a host path), mounted at /cache
    config_source: str | None = None  # host path or volume holding configs/, mounted read-only
    env: dict[str, str] = field(default_factory=dict)  # extra variables (HF_TOKEN, VLLM_*); never logged
    gpus: int | None = None  # None: no GPU; -1: all; N: that many
    shm_size: str = "2g"  # vLLM's workers share tensors through /dev/shm
    labels: dict[str, str] = field(default_factory=dict)
    health_interval_s: float = 2.0
    reach: str = "name"  # how this process reaches the engine: "name" (on the network) or "ip" (from the host)
    address: str | None = None  # with reach="ip": the container's address, known once it started
    api_key: str | None = field(default=None, repr=False)  # the engine's credential (VLLM_API_KEY); the gateway's
    plan: str | None = field(default=None, repr=False)  # its ModelPlan's public JSON: run, not planned again

    @property
    def base_url(self) -> str:
        """The engine as the gateway reaches it: by name on the shared network, or by IP from the host."""
        return f"http://{self.address or self.name}:{self.port}"

    def command(self) -> list[str]:
        plan = ["--plan-json", self.plan] if self.plan else []
        return ["python3", "-m", CONTAINER_ENTRY, "serve", self.serve, *plan, "--port", str(self.port)]

    def run_kwargs(self) -> dict[str, Any]:
        """Arguments for `client.containers.run` (docker SDK)."""
        from docker.types import DeviceRequest

        volumes = {self.cache_volume: {"bind": CACHE_MOUNT, "mode": "rw"}}
        if self.config_source:
            volumes[self.config_source] = {"bind": CONFIG_MOUNT, "mode": "ro"}
        kwargs: dict[str, Any] = {
            "image": self.image,
            "command": self.command(),
            "name": self.name,
            "hostname": self.name,
            "network": self.network,
            "environment": {**container_env(), **self.env, **({ENGINE_KEY_ENV: self.api_key} if self.api_key else {})},
            "volumes": volumes,
            "labels": {LABEL: self.name, "org.vllm-stack.serve": self.serve, **self.labels},
            "shm_size": self.shm_size,
            "init": True,  # tini as PID 1: signals reach vLLM, its children are reaped
            "detach": True,
            "healthcheck": {
                "test": ["CMD", "python3", "-c", _HEALTH_CMD % self.port],
                "interval": int(self.health_interval_s * _NS),
                "timeout": 3 * _NS,
                "retries": 3,
            },
        }
        if self.gpus is not None:
            kwargs["device_requests"] = [DeviceRequest(count=self.gpus, capabilities=[["gpu"]])]
        return kwargs


class DockerEngine(SleepEndpoints):
    """One engine container, driven like stack.engine.process.EngineProcess."""

    runtime_kind = "docker"  # shown in the deployment's labels (/admin/models)
    owns_process = True

    def __init__(self, spec: ContainerSpec, client: DockerClient | None = None) -> None:
        self.spec = spec
        self._client = client
        self.container: Container | None = None

    @property
    def client(self) -> DockerClient:
        if self._client is None:
            import docker

            self._client = docker.from_env()
        return self._client

    def start(self) -> int:
        """Create and start the container; returns its main process id on the host."""
        import docker.errors

        self.spec.address = None
        self._remove_stale()
        kwargs = self.spec.run_kwargs()
        kwargs.pop("detach")
        try:
            # create + start, not run: run() would pull a missing image (gigabytes, in the middle of a switch).
            self.container = self.client.containers.create(**kwargs)
            self.container.start()
        except docker.errors.ImageNotFound as exc:
            raise EngineError(f"engine image {self.spec.image!r} not found on this Docker host",
                              hint="build it (docker compose -f docker/docker-compose.yml --profile cpu build) "
                              "or docker pull it") from exc
        except docker.errors.APIError as exc:
            if self.container is not None:  # created, but it would not start: leave nothing behind
                with contextlib.suppress(docker.errors.APIError):
                    self.container.remove(force=True)
                self.container = None
            raise EngineError(f"Docker refused to start engine {self.spec.name!r}: {exc.explanation or exc}",
                              hint="check the network and volume names, and that the image exists") from exc
        self.container.reload()
        if self.spec.reach == "ip":
            nets = self.container.attrs["NetworkSettings"]["Networks"]
            self.spec.address = nets.get(self.spec.network, {}).get("IPAddress") or None
        return int(self.container.attrs["State"]["Pid"])

    def _remove_stale(self) -> None:
        """A container of ours left by a manager that died: remove it. Anything else with the name: refuse."""
        import docker.errors

        try:
            old = self.client.containers.get(self.spec.name)
        except docker.errors.NotFound:
            return
        if LABEL not in (old.labels or {}):
            raise EngineError(f"a container named {self.spec.name!r} exists and is not a vllm-stack engine",
                              hint="rename the engine or remove that container")
        old.remove(force=True)

    def exit_code(self) -> int | None:
        """None while the container runs (or before start); its exit code once it stopped; -1 if it vanished."""
        import docker.errors

        if self.container is None:
            return None
        try:
            self.container.reload()
        except docker.errors.NotFound:
            return -1
        state = self.container.attrs["State"]
        if state["Status"] in ("created", "running", "restarting", "paused"):
            return None
        return int(state.get("ExitCode", -1))

    def health(self) -> str:
        """Docker's view: starting, healthy, unhealthy (or none)."""
        if self.container is None:
            return "none"
        self.container.reload()
        return self.container.attrs["State"].get("Health", {}).get("Status", "none")

    def logs(self, lines: int = 40) -> str:
        if self.container is None:
            return ""
        with contextlib.suppress(Exception):
            return self.container.logs(tail=lines).decode(errors="replace")
        return ""

    def wait_ready(self, timeout: float, on_tick: Callable[[float, str], None] = lambda *_: None) -> float:
        """Seconds until /health answered (over HTTP, or Docker's healthcheck said healthy).
        On an exit or a timeout: the container is removed and EngineError raised with its last log lines."""
        started = time.monotonic()
        with httpx.Client(timeout=2.0) as http:
            while True:
                elapsed = time.monotonic() - started
                code = self.exit_code()
                if code is not None:
                    tail = self.logs()
                    self.stop(grace=0)
                    message, hint = explain_failure(tail, code)
                    raise EngineError(f"engine container {self.spec.name!r} exited with code {code} while "
                                      f"starting: {message}", hint=hint, log_tail=tail)
                if elapsed > timeout:
                    tail = self.logs()
                    self.stop(grace=5)
                    raise EngineError(f"engine container {self.spec.name!r} was not ready after {timeout:.0f} s; "
                                      "removed it", hint=f"raise the timeout, or `docker logs {self.spec.name}`",
                                      log_tail=tail)
                if self._answers(http) or self.health() == "healthy":
                    return elapsed
                lines = self.logs(2).splitlines()
                on_tick(elapsed, lines[-1][-160:] if lines else "")
                time.sleep(0.5)

    def _answers(self, http: httpx.Client) -> bool:
        try:
            return http.get(f"{self.spec.base_url}/health").status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, grace: float = 20) -> list[int]:
        """SIGTERM (docker stop), SIGKILL after `grace`, then remove the container. Returns [] when gone."""
        import docker.errors

        if self.container is None:
            return []
        with contextlib.suppress(docker.errors.NotFound):
            self.container.stop(timeout=int(grace))
        try:
            self.container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError:
            self.container.reload()
            return [int(self.container.attrs["State"]["Pid"])]
        return []
