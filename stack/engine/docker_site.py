"""Where the model manager puts engine containers (manager.runtime: docker): image, network, volumes, names.

In a compose deployment the gateway's own container says it all: engines run the gateway's image, join
its internal `engines` network, share its /cache volume and its configs mount, and carry its compose
project label (so `docker compose down --remove-orphans` also removes an engine a killed gateway left).
On a host, `manager.docker` must name the image and an existing network; engines are reached by IP.
Every problem is an EngineError naming the setting to change, raised before any container is created.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stack.config.sections.manager import DockerRuntimeConfig
from stack.engine.docker_runtime import CACHE_MOUNT, CONFIG_MOUNT, ContainerSpec
from stack.engine_env import is_secret, new_engine_key
from stack.errors import EngineError
from stack.planner.plans import ContainerSite

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container

PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
# Compose lists a project's containers by these two as well (v2.40 filters on them): without them
# `down --remove-orphans` and `ps` do not see an engine at all, and one a killed gateway left outlives `down`.
ONEOFF_LABEL = "com.docker.compose.oneoff"
CONFIG_HASH_LABEL = "com.docker.compose.config-hash"
_CONTAINER_ID = re.compile(r"/containers/([0-9a-f]{64})/")


@dataclass(frozen=True)
class Site(ContainerSite):
    """The resolved placement (the plan's ContainerSite, its fields) with this process's Docker client;
    `container_for` turns one planned model into a ContainerSpec."""

    client: Any = field(default=None, repr=False, compare=False)

    def container_for(self, serve: str, served_name: str, gpu: bool, can_sleep: bool,
                      environ: dict[str, str] | None = None) -> ContainerSpec:  # fmt: skip
        env = passed_env(self.pass_env, os.environ if environ is None else environ)
        if self.shares_cache:  # the gateway fetched the model into the shared /cache; engines need no Hub
            env.setdefault("HF_HUB_OFFLINE", "1")
        if can_sleep:  # what with_sleep does for a child process, said to the engine container's planner
            env.update(VSTACK_ENGINE__ENABLE_SLEEP_MODE="true", VLLM_SERVER_DEV_MODE="1")
        name = f"{self.name_prefix}-{_slug(served_name)}"
        labels = dict(self.labels)
        if PROJECT_LABEL in labels:  # one of the project's containers, under its own service name
            config = hashlib.sha256(f"{self.image}\0{serve}".encode()).hexdigest()
            labels.update({SERVICE_LABEL: name, ONEOFF_LABEL: "False", CONFIG_HASH_LABEL: config})
        return ContainerSpec(
            name=name, image=self.image, serve=serve, network=self.network, cache_volume=self.cache_volume,
            config_source=self.config_source, env=env, gpus=_gpu_count(self.gpus, gpu), api_key=new_engine_key(),
            shm_size=self.shm_size or ("16g" if gpu else "2g"),
            labels=labels, reach=self.reach,
        )  # fmt: skip


def passed_env(patterns: list[str], environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The variables `pass_env` names, never a secret of ours (stack.engine_env.is_secret), whatever it says."""
    return {k: v for k, v in environ.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns) and not is_secret(k)}


def _gpu_count(setting: str | int, gpu_profile: bool) -> int | None:
    if setting == "none" or (setting == "auto" and not gpu_profile):
        return None
    if setting in ("all", "auto"):
        return -1
    return int(setting)


def _slug(name: str) -> str:
    """A served name as a container (and DNS) name: [a-z0-9_.-]."""
    return re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-.") or "engine"


def own_container(client: DockerClient) -> Container | None:
    """The container this process runs in, if any: Docker names the hostname after the container's id, and
    the container's id appears in its own mounts (/etc/hostname, /etc/hosts) when the hostname was set."""
    import docker.errors

    candidates = [socket.gethostname()]
    mountinfo = Path("/proc/self/mountinfo")
    if mountinfo.is_file():
        candidates += _CONTAINER_ID.findall(mountinfo.read_text(errors="replace"))
    for ident in dict.fromkeys(candidates):
        try:
            return client.containers.get(ident)
        except (docker.errors.NotFound, docker.errors.APIError):
            continue
    return None


def _mount_source(container: Container, destination: str) -> str | None:
    for mount in container.attrs.get("Mounts", []):
        if mount.get("Destination") == destination:
            return mount.get("Name") or mount.get("Source")
    return None


_NO_DOCKER_HINT = (
    "mount the socket into the gateway (-v /var/run/docker.sock:/var/run/docker.sock) and give its user the "
    "socket's group (DOCKER_GID=$(stat -c %g /var/run/docker.sock) in docker/.env), or set DOCKER_HOST; "
    "VSTACK_MANAGER__RUNTIME=local runs engines as child processes instead"
)


def connect() -> DockerClient:
    """A Docker client that answers (DOCKER_HOST, else the socket), or an EngineError saying what to do."""
    import docker

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        raise EngineError(f"manager.runtime is docker but no Docker engine answers ({_reason(exc)})",
                          hint=_NO_DOCKER_HINT) from exc
    return client


def discover(settings: DockerRuntimeConfig, client: DockerClient, config_dir: Path | None,
             cache_dir: Path | None = None) -> Site:  # fmt: skip
    """Resolve every unset setting from the gateway's own container (or the host's defaults); check them."""
    import docker.errors

    me = own_container(client)
    project = (me.labels or {}).get(PROJECT_LABEL) if me is not None else None
    image = settings.image or (me.attrs["Image"] if me is not None else None)
    if not image:
        raise EngineError("manager.docker.image is not set and the gateway does not run in a container",
                          hint="set VSTACK_MANAGER__DOCKER__IMAGE=vllm-stack/engine-cpu:latest (or the GPU image)")
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound as exc:
        raise EngineError(f"engine image {image!r} (manager.docker.image) is not on this Docker host",
                          hint="build it: docker compose -f docker/docker-compose.yml --profile cpu build") from exc

    network, reach, internal = _network(settings.network, client, me, project)
    own_cache = _mount_source(me, CACHE_MOUNT) if me is not None else None
    cache = settings.cache_volume or own_cache or "vstack-models"
    shares = bool(own_cache) and cache == own_cache and cache_dir is not None and Path(cache_dir) == Path(CACHE_MOUNT)
    configs = settings.config_source or (me is not None and _mount_source(me, CONFIG_MOUNT)) or None
    if configs is None and me is None and config_dir is not None:
        configs = str(config_dir.resolve())
    warnings = []
    if me is None and internal:
        warnings.append(f"network {network!r} is internal: engine containers cannot download their models; the "
                        f"volume {cache!r} must already hold them (`vstack models pull` in a container with it)")
    prefix = settings.name_prefix or (f"{project}-engine" if project else "vstack-engine")
    return Site(image=image, network=network, cache_volume=cache, config_source=configs, name_prefix=prefix,
                reach=reach, gpus=settings.gpus, shm_size=settings.shm_size, pass_env=settings.pass_env,
                labels={PROJECT_LABEL: project} if project else {}, shares_cache=shares, warnings=warnings,
                client=client)  # fmt: skip


def _network(wanted: str, client: DockerClient, me: Container | None, project: str | None
             ) -> tuple[str, str, bool]:  # fmt: skip
    """(the network's full name, how the gateway reaches engines on it, whether it is internal)."""
    import docker.errors

    if me is not None:
        mine = list(me.attrs["NetworkSettings"]["Networks"])
        for name in (wanted, f"{project}_{wanted}" if project else None):
            if name in mine:
                return name, "name", True  # internal or not, the gateway fetches models for its engines
        raise EngineError(
            f"the gateway's container is not on network {wanted!r} (manager.docker.network); it is on "
            f"{', '.join(sorted(mine))}",
            hint="attach the gateway to the engines' network in the compose file, or set "
            "VSTACK_MANAGER__DOCKER__NETWORK to one of those",
        )
    try:
        network = client.networks.get(wanted)
    except docker.errors.NotFound as exc:
        raise EngineError(f"Docker network {wanted!r} (manager.docker.network) does not exist",
                          hint=f"docker network create --internal {wanted}  (engines need no route out once "
                          "their model is in the cache volume)") from exc  # fmt: skip
    return wanted, "ip", bool(network.attrs.get("Internal"))


def _reason(exc: Exception) -> str:
    text = str(exc)
    return "permission denied on the Docker socket" if "ermission denied" in text else type(exc).__name__
