"""Docker tests: the real compose file on a real dockerd (docker/ci-setup.sh makes a bare machine ready).

Tests that need a Docker engine are marked `docker` and skip, saying why, when none answers. Settings come
from the environment, else from the file docker/ci-setup.sh writes ($VSTACK_DOCKER_TOOLS/ci.env):
  VSTACK_DOCKER_BASE_IMAGE        base for our Python images (default: the Dockerfiles' python:3.11-slim)
  VSTACK_DOCKER_PROMETHEUS_IMAGE  stands in for prom/prometheus where no registry is reachable
  VSTACK_DOCKER_GRAFANA_IMAGE     a Grafana image present locally (else the Grafana checks skip)
  VSTACK_DOCKER_WHEELS            a folder with torch 2.13.0+cpu, served on loopback during the build
  VSTACK_DOCKER_WHEELS_PORT       its loopback port (default 18765)
  VSTACK_DOCKER_ENFORCE_EAGER     1 (default) skips torch.compile in the static and site tests' engines
                                  (never in test_compose.py, which runs Compose as the README says)
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import secrets
import shutil
import socketserver
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER_DIR = ROOT / "docker"
COMPOSE_FILE = DOCKER_DIR / "docker-compose.yml"
MODEL = "smollm2-135m-instruct"


def settings() -> dict[str, str]:
    found: dict[str, str] = {}
    ci_env = Path(os.environ.get("VSTACK_DOCKER_TOOLS", "/opt/vstack-docker-tools")) / "ci.env"
    if ci_env.is_file():
        for line in ci_env.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and key.startswith("VSTACK_DOCKER_"):
                found[key.strip()] = value.strip()
    found.update({k: v for k, v in os.environ.items() if k.startswith("VSTACK_DOCKER_")})
    return found


def docker_reachable() -> str | None:
    """None when a Docker engine answers; else why not."""
    try:
        import docker
    except ImportError:
        return "the Docker SDK (`docker` package) is not installed: pip install 'docker>=7'"
    try:
        docker.from_env(timeout=5).ping()
    except Exception as exc:
        return f"no Docker engine reachable ({type(exc).__name__}); docker/ci-setup.sh installs and starts one"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    docker_items = [i for i in items if i.get_closest_marker("docker")]
    if not docker_items:
        return
    reason = docker_reachable()
    if reason:
        for item in docker_items:
            item.add_marker(pytest.mark.skip(reason=reason))


def tool(name: str) -> str | None:
    tools = Path(os.environ.get("VSTACK_DOCKER_TOOLS", "/opt/vstack-docker-tools")) / "bin" / name
    return shutil.which(name) or (str(tools) if tools.is_file() else None)


def compose_available() -> bool:
    return subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve_folder(folder: str, port: int) -> Iterator[str]:
    """Serve a wheel folder on loopback: `docker build --network host` reaches it as a pip find-links page.
    A fixed port: the URL is a build argument, and a new one each run would rebuild every layer."""
    handler = functools.partial(_QuietHandler, directory=folder)
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    with socketserver.ThreadingTCPServer(("127.0.0.1", port), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/"
        finally:
            server.shutdown()


@dataclass
class Compose:
    """`docker compose` on docker/docker-compose.yml under a project name of the tests' own."""

    project: str
    env_file: Path
    env: dict[str, str] = field(default_factory=dict)
    profile: str = "cpu"
    overlays: tuple[Path, ...] = ()  # more compose files over docker/docker-compose.yml (`-f`, in order)

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        files = [a for f in (COMPOSE_FILE, *self.overlays) for a in ("-f", str(f))]
        cmd = ["docker", "compose", *files, "-p", self.project, "--env-file", str(self.env_file),
               "--profile", self.profile, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                              env={**os.environ, "COMPOSE_BAKE": "false", **self.env})
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd[2:])} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                                 f"{proc.stderr[-3000:]}")
        return proc

    def logs(self, service: str, lines: int = 60) -> str:
        return self.run("logs", "--no-color", "--tail", str(lines), service, check=False).stdout


def write_env_file(path: Path, **values: str) -> dict[str, str]:
    """A docker/.env like a user's: secrets generated here, written 0600, never printed."""
    env = {
        "VSTACK_API_KEY": "sk-test-" + secrets.token_urlsafe(16),
        "VSTACK_ADMIN_KEY": "adm-test-" + secrets.token_urlsafe(16),
        "VSTACK_METRICS_KEY": "met-test-" + secrets.token_urlsafe(16),
        "GRAFANA_ADMIN_PASSWORD": secrets.token_urlsafe(12),
        **values,
    }
    path.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    path.chmod(0o600)
    return env


def build_env(cfg: dict[str, str], wheels_url: str | None) -> dict[str, str]:
    """Interpolation variables for build and up: local base images where no registry is reachable."""
    env: dict[str, str] = {}
    if cfg.get("VSTACK_DOCKER_BASE_IMAGE"):
        env["PYTHON_BASE_IMAGE"] = cfg["VSTACK_DOCKER_BASE_IMAGE"]
    if cfg.get("VSTACK_DOCKER_PROMETHEUS_IMAGE"):
        env["PROMETHEUS_IMAGE"] = cfg["VSTACK_DOCKER_PROMETHEUS_IMAGE"]
    if cfg.get("VSTACK_DOCKER_GRAFANA_IMAGE"):
        env["GRAFANA_IMAGE"] = cfg["VSTACK_DOCKER_GRAFANA_IMAGE"]
    if wheels_url:
        env["PIP_FIND_LINKS"] = wheels_url
        env["TORCH_INDEX_URL"] = ""  # the local folder has torch; an unreachable index only costs retries
    return env


@pytest.fixture(scope="session")
def docker_settings() -> dict[str, str]:
    return settings()


@pytest.fixture(scope="session")
def docker_client():
    import docker

    client = docker.from_env(timeout=120)
    yield client
    client.close()


@pytest.fixture(scope="session")
def built_images(docker_settings: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Build the gateway and CPU engine images once per session (docker compose build, BuildKit)."""
    if not compose_available():
        pytest.fail("`docker compose` (v2) is not installed; docker/ci-setup.sh links it")
    env_file = tmp_path_factory.mktemp("build") / ".env"
    write_env_file(env_file)
    wheels = docker_settings.get("VSTACK_DOCKER_WHEELS")
    with contextlib.ExitStack() as stack:
        port = int(docker_settings.get("VSTACK_DOCKER_WHEELS_PORT", "18765"))
        url = stack.enter_context(serve_folder(wheels, port)) if wheels else None
        env = build_env(docker_settings, url)
        compose = Compose("vstack-build", env_file, env, profile="static-cpu")
        started = time.monotonic()
        compose.run("build", "gateway", "engine-cpu", timeout=1500)
        print(f"images built in {time.monotonic() - started:.0f} s")
    return {"engine": "vllm-stack/engine-cpu:latest", "gateway": "vllm-stack/gateway:latest"}
