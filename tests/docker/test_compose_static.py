"""The static alternative for real (profile static-cpu): the model's own engine service, its model pulled by
the one-shot model-pull service, the slim gateway with no Docker socket whose model manager (--manage)
only sleeps the idle engine and wakes it on the next request, then `down -v` leaving nothing behind.

On a CPU, vLLM's sleep endpoints (VLLM_SERVER_DEV_MODE=1) answer and keep the engine's state but free no
memory; what is tested here is the manager's side: idle -> asleep (the engine says so itself) -> a request
wakes it and is answered, the engine container never stopped."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench.harness.waiting import wait_for, wait_http
from tests.docker.conftest import MODEL, ROOT, Compose, build_env, write_env_file

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]
PROJECT = "vstack-static-test"
PORT = 18001


@pytest.fixture(scope="module")
def static(built_images, docker_settings, tmp_path_factory) -> Iterator[tuple[Compose, dict[str, str]]]:
    env_file = tmp_path_factory.mktemp("static") / ".env"
    extra = {"GATEWAY_PORT": str(PORT), "GATEWAY_BIND": "127.0.0.1", "CONFIG_DIR": str(ROOT / "configs"),
             "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1",
             "VSTACK_MANAGER__IDLE_TTL_S": "4"}  # fmt: skip
    if docker_settings.get("VSTACK_DOCKER_ENFORCE_EAGER", "1") == "1":
        extra["VSTACK_ENGINE__ENFORCE_EAGER"] = "true"
    env = write_env_file(env_file, **extra)
    compose = Compose(PROJECT, env_file, build_env(docker_settings, None), profile="static-cpu")
    compose.run("down", "-v", "--remove-orphans", check=False)
    started = time.monotonic()
    try:
        compose.run("up", "-d", "--no-build", "--pull", "never", "gateway", timeout=1200)
        # `up -d` returns once the gateway's container started; /ready is 503 until its engine answers.
        wait_http(f"http://127.0.0.1:{PORT}/ready", 120)
        print(f"static-cpu up (model pulled, engine healthy, gateway started): {time.monotonic() - started:.0f} s")
        yield compose, env
    except AssertionError:
        for svc in ("model-pull-cpu", "engine-cpu", "gateway"):
            print(f"--- {svc} ---\n{compose.logs(svc)}")
        raise
    finally:
        compose.run("down", "-v", "--remove-orphans", "--timeout", "20", check=False, timeout=300)


def _state(env: dict[str, str]) -> dict[str, Any]:
    body = httpx.get(f"http://127.0.0.1:{PORT}/admin/models", timeout=10,
                     headers={"Authorization": f"Bearer {env['VSTACK_ADMIN_KEY']}"}).json()  # fmt: skip
    return next(m for m in body["models"] if m["model"] == MODEL)


def _engine_url(client: Any) -> str:
    engine = client.containers.get(f"{PROJECT}-engine-cpu-1")
    return f"http://{engine.attrs['NetworkSettings']['Networks'][f'{PROJECT}_engines']['IPAddress']}:8000"


def _ask(env: dict[str, str]) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key=env["VSTACK_API_KEY"], timeout=180, max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=24,
        temperature=0)  # fmt: skip
    return reply.choices[0].message.content or ""


def _wait_state(env: dict[str, str], wanted: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (model := _state(env))["state"] != wanted and time.monotonic() < deadline:
        time.sleep(0.5)
    assert model["state"] == wanted, model
    return model


def test_the_manager_sleeps_the_idle_engine_and_a_request_wakes_it(static, docker_client: Any) -> None:
    _, env = static
    assert "Paris" in _ask(env)
    dep = _state(env)["deployments"][0]
    assert dep["api_base"] == "http://engine:8000" and dep["labels"]["runtime"] == "attached"

    _wait_state(env, "sleeping", 60)  # idle_ttl_s is 4 here
    engine = _engine_url(docker_client)
    # The manager says "sleeping" as it sends the engine to sleep; the engine says so once it is asleep.
    wait_for(lambda: httpx.get(f"{engine}/is_sleeping", timeout=10).json()["is_sleeping"] is True, 60,
             "the engine saying it is asleep")  # fmt: skip

    assert "Paris" in _ask(env)  # waits for the wake-up, then is answered
    assert _state(env)["state"] == "ready"
    assert httpx.get(f"{engine}/is_sleeping", timeout=10).json()["is_sleeping"] is False
    assert docker_client.containers.get(f"{PROJECT}-engine-cpu-1").attrs["RestartCount"] == 0


def test_no_socket_and_nothing_left_after_down(static, docker_client: Any) -> None:
    compose, _ = static
    gateway = docker_client.containers.get(f"{PROJECT}-gateway-1")
    assert all(m["Destination"] != "/var/run/docker.sock" for m in gateway.attrs["Mounts"])
    compose.run("down", "-v", "--remove-orphans", "--timeout", "20", timeout=300)
    label = {"label": f"com.docker.compose.project={PROJECT}"}
    assert docker_client.containers.list(all=True, filters=label) == []
    assert docker_client.networks.list(filters=label) == []
    assert docker_client.volumes.list(filters=label) == []
