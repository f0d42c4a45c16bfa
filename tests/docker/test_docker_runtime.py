"""stack.engine.docker_runtime: the container an engine gets, and DockerEngine against a real dockerd.

The happy path (an engine container serving SmolLM2, registered in the gateway, sleep/wake) runs in
test_compose.py, inside the compose deployment; here are the container's shape and the failure paths."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from stack.engine.docker_runtime import CACHE_MOUNT, CONFIG_MOUNT, LABEL, ContainerSpec, DockerEngine
from stack.entrypoints.engine_container import main
from stack.errors import EngineError
from tests.docker.conftest import ROOT


def _spec(**over: Any) -> ContainerSpec:
    base = {"name": "engine-a", "image": "vllm-stack/engine-cpu:latest", "serve": "smollm2-135m-instruct",
            "network": "vllm-stack_engines"}
    return ContainerSpec(**{**base, **over})


def test_container_is_on_the_internal_network_with_nothing_published() -> None:
    kw = _spec(config_source="/srv/configs", env={"HF_TOKEN": "hf_x"}).run_kwargs()
    assert kw["network"] == "vllm-stack_engines" and kw["hostname"] == "engine-a"
    assert "ports" not in kw and "publish_all_ports" not in kw
    assert kw["command"] == ["python3", "-m", "stack.entrypoints.engine_container", "serve", "smollm2-135m-instruct",
                             "--port", "8000"]
    assert kw["volumes"] == {"vstack-models": {"bind": CACHE_MOUNT, "mode": "rw"},
                             "/srv/configs": {"bind": CONFIG_MOUNT, "mode": "ro"}}
    env = kw["environment"]
    assert env["HF_TOKEN"] == "hf_x" and env["VSTACK_CACHE_DIR"] == CACHE_MOUNT
    assert env["VLLM_CACHE_ROOT"].startswith(CACHE_MOUNT) and env["HF_HOME"].startswith(CACHE_MOUNT)
    assert kw["labels"][LABEL] == "engine-a" and kw["init"] is True
    assert "device_requests" not in kw
    assert _spec().base_url == "http://engine-a:8000"


def test_gpu_engines_get_a_device_request() -> None:
    (req,) = _spec(gpus=-1).run_kwargs()["device_requests"]
    assert req["Count"] == -1 and req["Capabilities"] == [["gpu"]]


def test_serve_reports_a_config_error_without_starting_vllm(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("VSTACK_CONFIG_DIR", str(ROOT / "configs"))
    assert main(["serve", "no-such-model"]) == 2
    assert "no-such-model" in capsys.readouterr().err


@pytest.mark.docker
def test_a_missing_image_is_an_engine_error(docker_client: Any) -> None:
    engine = DockerEngine(_spec(name=f"vstack-test-{uuid.uuid4().hex[:8]}", image="vllm-stack/no-such-image:0"),
                          docker_client)
    with pytest.raises(EngineError, match="not found"):
        engine.start()


@pytest.mark.docker
def test_an_engine_that_exits_while_starting_is_reported_and_removed(
    docker_client: Any, built_images: dict[str, str]
) -> None:
    network = docker_client.networks.create(f"vstack-test-{uuid.uuid4().hex[:8]}", internal=True)
    volume = docker_client.volumes.create(f"vstack-test-{uuid.uuid4().hex[:8]}")
    spec = _spec(name=f"vstack-test-{uuid.uuid4().hex[:8]}", image=built_images["engine"], serve="no-such-model",
                 network=network.name, cache_volume=volume.name, config_source=str(ROOT / "configs"), reach="ip")
    engine = DockerEngine(spec, docker_client)
    try:
        assert engine.start() > 0
        with pytest.raises(EngineError) as err:
            engine.wait_ready(120)
        assert "exited with code 2" in err.value.message
        assert "no-such-model" in err.value.log_tail
        assert engine.stop() == []
        assert docker_client.containers.list(all=True, filters={"name": spec.name}) == []
    finally:
        engine.stop(grace=0)
        network.remove()
        volume.remove(force=True)


@pytest.mark.docker
def test_a_stale_engine_container_is_replaced_but_a_stranger_is_not(
    docker_client: Any, built_images: dict[str, str], docker_settings: dict[str, str]
) -> None:
    name = f"vstack-test-{uuid.uuid4().hex[:8]}"
    base = docker_settings.get("VSTACK_DOCKER_BASE_IMAGE", built_images["engine"])
    stranger = docker_client.containers.create(base, ["sleep", "1"], name=name)
    try:
        with pytest.raises(EngineError, match="not a vllm-stack engine"):
            DockerEngine(_spec(name=name), docker_client).start()
    finally:
        stranger.remove(force=True)
    stale = docker_client.containers.create(base, ["sleep", "1"], name=name, labels={LABEL: name})
    engine = DockerEngine(_spec(name=name, image="vllm-stack/no-such-image:0"), docker_client)
    with pytest.raises(EngineError, match="not found"):
        engine.start()  # the stale one was removed first; then the (missing) image stops it
    import docker.errors

    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(stale.id)
