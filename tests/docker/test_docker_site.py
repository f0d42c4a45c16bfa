"""manager.runtime: docker. Where engine containers go (stack.engine.docker_site), and a gateway on this
host whose model manager runs its engine as a container on a real dockerd: chat through it, then a
shutdown that leaves no container behind. The in-container case (the compose deployment, engines found
by name on the internal network, a switch) is in test_compose.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import httpx
import pytest

from stack.config.sections.manager import DockerRuntimeConfig
from stack.engine.docker_site import PROJECT_LABEL, SERVICE_LABEL, Site, connect, discover, passed_env
from stack.errors import EngineError
from stack.manager.client import admin_headers
from tests.docker.conftest import MODEL, ROOT


def _site(**over: Any) -> Site:
    base: dict[str, Any] = dict(image="img:1", network="proj_engines", cache_volume="proj_models",
                                config_source="/srv/configs", name_prefix="proj-engine", reach="name", gpus="auto",
                                shm_size=None, pass_env=DockerRuntimeConfig().pass_env,
                                labels={PROJECT_LABEL: "proj"}, shares_cache=True)  # fmt: skip
    return Site(**{**base, **over})


ENVIRON = {"HF_TOKEN": "hf_secret", "VSTACK_ENGINE__MAX_MODEL_LEN": "4096", "VSTACK_API_KEY": "sk-1",
           "OPENAI_API_KEY": "sk-2", "VSTACK_ADMIN_KEY": "adm", "PATH": "/usr/bin"}  # fmt: skip


def test_an_engine_container_gets_hub_access_and_engine_overrides_but_no_gateway_secret() -> None:
    spec = _site().container_for("cpu-smollm2", "Org/Model_7B", gpu=False, can_sleep=False, environ=ENVIRON)
    assert spec.name == "proj-engine-org-model_7b" and spec.serve == "cpu-smollm2"
    assert spec.env == {"HF_TOKEN": "hf_secret", "VSTACK_ENGINE__MAX_MODEL_LEN": "4096", "HF_HUB_OFFLINE": "1"}
    assert spec.network == "proj_engines" and spec.cache_volume == "proj_models" and spec.gpus is None
    assert spec.shm_size == "2g"
    # the labels compose lists a project's containers by: `down --remove-orphans` and `ps` see the engine
    assert spec.labels == {PROJECT_LABEL: "proj", SERVICE_LABEL: "proj-engine-org-model_7b",
                           "com.docker.compose.oneoff": "False", "com.docker.compose.config-hash": ANY}
    assert spec.base_url == "http://proj-engine-org-model_7b:8000"


def test_sleep_mode_and_gpus_reach_the_container() -> None:
    spec = _site().container_for("h100/llama", "llama", gpu=True, can_sleep=True, environ={"HF_HUB_OFFLINE": "0"})
    assert spec.env == {"HF_HUB_OFFLINE": "0", "VSTACK_ENGINE__ENABLE_SLEEP_MODE": "true",
                        "VLLM_SERVER_DEV_MODE": "1"}  # fmt: skip
    assert spec.gpus == -1 and spec.shm_size == "16g"
    assert _site(gpus=2).container_for("m", "m", gpu=True, can_sleep=False, environ={}).gpus == 2
    assert _site(gpus="none").container_for("m", "m", gpu=True, can_sleep=False, environ={}).gpus is None
    # From the host, engines are reached by IP and may fetch their own model: no forced offline mode.
    host = _site(reach="ip", labels={}, shares_cache=False)
    host = host.container_for("m", "m", gpu=False, can_sleep=False, environ={})
    assert host.env == {} and host.labels == {}


def test_pass_env_patterns() -> None:
    assert passed_env(["HF_*"], {"HF_TOKEN": "a", "HF_HOME": "b", "XHF_X": "c"}) == {"HF_TOKEN": "a", "HF_HOME": "b"}


def test_no_docker_engine_is_an_error_that_names_the_socket_and_the_way_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(EngineError) as err:
        connect()
    assert "no Docker engine answers" in err.value.message
    assert "DOCKER_GID" in err.value.hint and "VSTACK_MANAGER__RUNTIME=local" in err.value.hint


@pytest.mark.docker
def test_on_a_host_the_image_and_network_must_exist(docker_client: Any, built_images: dict[str, str]) -> None:
    with pytest.raises(EngineError) as err:
        discover(DockerRuntimeConfig(), docker_client, ROOT / "configs")
    assert "manager.docker.image is not set" in err.value.message
    with pytest.raises(EngineError) as err:
        discover(DockerRuntimeConfig(image="vllm-stack/no-such-image:0"), docker_client, None)
    assert "manager.docker.image" in err.value.message and "build" in err.value.hint
    name = f"vstack-test-{uuid.uuid4().hex[:8]}"
    with pytest.raises(EngineError) as err:
        discover(DockerRuntimeConfig(image=built_images["engine"], network=name), docker_client, None)
    assert name in err.value.message and f"docker network create --internal {name}" in err.value.hint

    network = docker_client.networks.create(name, internal=True)
    try:
        site = discover(DockerRuntimeConfig(image=built_images["engine"], network=name), docker_client,
                        ROOT / "configs")  # fmt: skip
    finally:
        network.remove()
    assert (site.network, site.reach, site.cache_volume) == (name, "ip", "vstack-models")
    assert site.config_source == str((ROOT / "configs").resolve()) and site.name_prefix == "vstack-engine"
    assert site.shares_cache is False  # a gateway on a host leaves the engines' volume to them
    (warning,) = site.warnings  # ... which on an internal network cannot download anything
    assert "internal" in warning and "vstack-models" in warning


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_a_gateway_on_the_host_runs_its_engine_as_a_container(
    docker_client: Any, built_images: dict[str, str], tmp_path: Path, docker_settings: dict[str, str]
) -> None:
    from openai import OpenAI

    from bench.harness.waiting import free_port, wait_http

    tag = uuid.uuid4().hex[:8]
    network = docker_client.networks.create(f"vstack-test-{tag}", internal=True)
    volume = docker_client.volumes.create(f"vstack-test-{tag}")
    port, log = free_port(), tmp_path / "gateway.log"
    env = {**os.environ, "VSTACK_MANAGER__RUNTIME": "docker", "VSTACK_MANAGER__DOCKER__IMAGE": built_images["engine"],
           "VSTACK_MANAGER__DOCKER__NETWORK": network.name, "VSTACK_MANAGER__DOCKER__CACHE_VOLUME": volume.name,
           "VSTACK_MANAGER__DOCKER__NAME_PREFIX": f"vstack-test-{tag}", "HF_HUB_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VSTACK_CACHE_DIR": str(tmp_path / "cache"),
           "VSTACK_STATE_DIR": str(tmp_path / "state")}  # fmt: skip
    if docker_settings.get("VSTACK_DOCKER_ENFORCE_EAGER", "1") == "1":
        env["VSTACK_ENGINE__ENFORCE_EAGER"] = "true"
    name = f"vstack-test-{tag}-{MODEL}"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "stack.entrypoints.up", MODEL, "--port", str(port)], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/ready", 600, proc, log)  # 503 while the engine starts, 200 once it answers
        container = docker_client.containers.get(name)
        assert container.labels["org.vllm-stack.engine"] == name and not container.ports
        models = httpx.get(f"{url}/admin/models", timeout=10,  # with the token `up` wrote there (adr/0039)
                           headers=admin_headers(url, tmp_path / "state")).json()["models"]
        (dep,) = models[0]["deployments"]
        ip = container.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
        assert dep["api_base"] == f"http://{ip}:8000" and dep["labels"]["runtime"] == "docker"
        reply = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=24,
            temperature=0)  # fmt: skip
        assert "Paris" in (reply.choices[0].message.content or "")
        proc.send_signal(signal.SIGTERM)
        # uvicorn re-raises the SIGTERM it handled once shutdown is done: -15 after a clean shutdown.
        assert proc.wait(120) in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in log.read_text()
        assert docker_client.containers.list(all=True, filters={"name": name}) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for c in docker_client.containers.list(all=True, filters={"name": f"vstack-test-{tag}"}):
            c.remove(force=True)
        network.remove()
        volume.remove(force=True)
    assert not (tmp_path / "cache" / "models").exists(), "the gateway fetched a model its engine fetches itself"
