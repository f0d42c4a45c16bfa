"""The compose deployment for real, in order: build, `up` (cpu profile: the gateway whose model manager
runs each model's engine as a container, through the Docker socket), a chat answered by SmolLM2 through
the gateway with the official client, Prometheus having scraped the gateway and the engine (its HTTP API),
every dashboard query evaluating there, Grafana healthy with the dashboard provisioned (where a Grafana
image exists locally), a model switch through the admin API (a new engine container, the old one gone),
then `down -v` leaving no container, network or volume of the project behind. The models volume, which holds
vLLM's compile cache, is one this machine keeps across runs (compose-kept-cache.yml): the first run compiles
cold as a user's first `up` does, the next ones start from the cache as a user's next `up` does (adr/0038).

Compose runs as the README says: no VSTACK_ENGINE__* or other variable a user would not set, so the engine
compiles the model with torch.compile as it does on a user's CPU (the image carries g++ for it: adr/0022;
before, it hung on InvalidCxxCompiler and only a test-only ENFORCE_EAGER hid that). What is set here is what
a user of this machine sets: ports, the keys, DOCKER_GID, HF_HUB_OFFLINE (no Hub here), the KV space, and
the second model the switch needs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from stack.engine.docker_runtime import LABEL
from tests.docker.conftest import MODEL, ROOT, Compose, build_env, write_env_file
from tests.docker.test_files import dashboard_queries

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]
PROJECT = "vstack-test"
# The models volume (the model copy, vLLM's compile cache) is kept across runs; `down -v` removes the rest.
KEPT_OVERLAY = Path(__file__).with_name("compose-kept-cache.yml")
KEPT_CACHE = "vstack-test-kept-cache"
SERVICES_WITHOUT_GRAFANA = ["vstack-cpu", "prometheus"]
SOCKET = "/var/run/docker.sock"
ENGINE_PREFIX = f"{PROJECT}-engine-"  # the manager's engine containers: <project>-engine-<served name>
OTHER = "smollm2-b"  # a second model for the switch: SmolLM2's files under another name
OTHER_MODEL_YAML = f"""name: {OTHER}
extends: {MODEL}
description: SmolLM2 again under another name, so that a CPU machine without the Hub has two models
served_name: {OTHER}
source: {{path: /cache/models/{MODEL}}}
"""


@dataclass
class Deployment:
    compose: Compose
    env: dict[str, str]
    gateway: str
    grafana: bool
    started_s: float

    @property
    def api_key(self) -> str:
        return self.env["VSTACK_API_KEY"]

    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.env['VSTACK_ADMIN_KEY']}"}


def _image_present(client: Any, name: str) -> bool:
    import docker.errors

    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def _wait(what: str, check, timeout: float, every: float = 2.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, KeyError, IndexError, ValueError):
            last = check()
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"{what}: not after {timeout:.0f} s (last: {last!r})")


@pytest.fixture(scope="module")
def deployment(built_images, docker_settings, docker_client, tmp_path_factory) -> Iterator[Deployment]:
    work = tmp_path_factory.mktemp("compose")
    env_file = work / ".env"
    configs = work / "configs"  # the repository's configs/ plus a second model (CONFIG_DIR mounts it)
    shutil.copytree(ROOT / "configs", configs)
    (configs / "models" / f"{OTHER}.yaml").write_text(OTHER_MODEL_YAML)
    port = 18000
    extra = {"GATEWAY_PORT": str(port), "GATEWAY_BIND": "127.0.0.1", "GRAFANA_PORT": "13000",
             "CONFIG_DIR": str(configs), "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
             "VSTACK_MANAGER__MODELS": json.dumps([MODEL, OTHER]), "DOCKER_GID": str(os.stat(SOCKET).st_gid)}
    env = write_env_file(env_file, **extra)
    docker_client.volumes.create(KEPT_CACHE)  # idempotent: the volume this machine keeps (KEPT_OVERLAY)
    compose = Compose(PROJECT, env_file, build_env(docker_settings, None), overlays=(KEPT_OVERLAY,))
    grafana_image = compose.env.get("GRAFANA_IMAGE", "grafana/grafana-oss:12.2.1")
    grafana = _image_present(docker_client, grafana_image)
    _remove_leftover_engines(docker_client)  # a run of a version whose engines `down` could not see
    compose.run("down", "-v", "--remove-orphans", check=False)  # a previous run killed half-way
    started = time.monotonic()
    services = [] if grafana else SERVICES_WITHOUT_GRAFANA
    try:
        # `up` returns once the engine is healthy and everything after it has started (depends_on chain).
        compose.run("up", "-d", "--no-build", "--pull", "never", *services, timeout=1200)
        yield Deployment(compose, env, f"http://127.0.0.1:{port}", grafana, time.monotonic() - started)
    except AssertionError:
        for svc in SERVICES_WITHOUT_GRAFANA:
            print(f"--- {svc} ---\n{compose.logs(svc)}")
        for engine in _engine_containers(docker_client):
            print(f"--- {engine.name} ---\n{engine.logs(tail=60).decode(errors='replace')}")
        raise
    finally:
        compose.run("down", "-v", "--remove-orphans", "--timeout", "20", check=False, timeout=300)


def _engine_containers(client: Any) -> list[Any]:
    return [c for c in client.containers.list(all=True) if c.name.startswith(ENGINE_PREFIX)]


def _remove_leftover_engines(client: Any) -> None:
    for c in _engine_containers(client):
        if LABEL in (c.labels or {}):
            c.remove(force=True)


def test_the_engine_is_a_container_the_manager_started(deployment: Deployment, docker_client: Any) -> None:
    """On the internal network only, nothing published, the shared model volume, labelled as ours and as
    the project's (so `down --remove-orphans` would find one a killed gateway left)."""
    engines = _engine_containers(docker_client)
    assert len(engines) == 1, [(c.name, c.status) for c in engines]
    (engine,) = engines
    assert engine.name == f"{ENGINE_PREFIX}{MODEL}" and engine.status == "running"
    assert list(engine.attrs["NetworkSettings"]["Networks"]) == [f"{PROJECT}_engines"]
    assert not engine.ports and engine.labels["com.docker.compose.project"] == PROJECT
    mounts = {m["Destination"]: m for m in engine.attrs["Mounts"]}
    assert mounts["/cache"]["Name"] == KEPT_CACHE and mounts["/etc/vstack/configs"]["RW"] is False
    gateway = docker_client.containers.get(f"{PROJECT}-vstack-cpu-1")
    assert engine.image.id == gateway.image.id
    models = httpx.get(f"{deployment.gateway}/admin/models", headers=deployment.admin(), timeout=10).json()
    dep = next(m for m in models["models"] if m["model"] == MODEL)["deployments"][0]
    assert dep["api_base"] == f"http://{engine.name}:8000" and dep["labels"]["runtime"] == "docker"


def test_chat_through_the_gateway_gets_a_real_answer(deployment: Deployment) -> None:
    from openai import AuthenticationError, OpenAI

    print(f"compose up to healthy: {deployment.started_s:.0f} s")
    client = OpenAI(base_url=f"{deployment.gateway}/v1", api_key=deployment.api_key, timeout=180, max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24, temperature=0,
    )
    text = reply.choices[0].message.content or ""
    assert "Paris" in text, text
    assert reply.usage and reply.usage.completion_tokens > 0
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices).strip()
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=f"{deployment.gateway}/v1", api_key="wrong", max_retries=0).models.list()


def _prometheus(deployment: Deployment, docker_client: Any) -> str:
    """Prometheus publishes no port: reach it at its address on the monitoring network (Linux hosts)."""
    container = docker_client.containers.get(f"{PROJECT}-prometheus-1")
    ip = container.attrs["NetworkSettings"]["Networks"][f"{PROJECT}_monitoring"]["IPAddress"]
    return f"http://{ip}:9090"


def _print_discovery(deployment: Deployment, prom: str) -> None:
    """What each side of the engines' service discovery saw: the gateway's list and Prometheus' targets."""
    auth = {"Authorization": f"Bearer {deployment.env['VSTACK_METRICS_KEY']}"}
    with contextlib.suppress(httpx.HTTPError):
        listed = httpx.get(f"{deployment.gateway}/metrics/targets", headers=auth, timeout=10)
        print("gateway /metrics/targets:", listed.status_code, listed.text[:2000])
    with contextlib.suppress(httpx.HTTPError):
        print("prometheus targets:", httpx.get(f"{prom}/api/v1/targets?state=any", timeout=10).text[:4000])
    print("--- prometheus ---\n" + deployment.compose.logs("prometheus")[-4000:])


def _query(prom: str, expr: str) -> list[dict]:
    body = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def _gateway_requests(deployment: Deployment) -> float:
    """vstack_gateway_requests_total for MODEL's answered requests, as the gateway itself counts them now."""
    from prometheus_client.parser import text_string_to_metric_families

    auth = {"Authorization": f"Bearer {deployment.env['VSTACK_METRICS_KEY']}"}
    text = httpx.get(f"{deployment.gateway}/metrics", headers=auth, timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "vstack_gateway_requests_total" and s.labels.get("model") == MODEL
               and s.labels.get("status") == "200")  # fmt: skip


def test_prometheus_scraped_the_gateway_and_the_engine(deployment: Deployment, docker_client: Any) -> None:
    prom = _prometheus(deployment, docker_client)
    _wait("gateway target up", lambda: _query(prom, 'up{job="gateway"} == 1'), 60)
    # Two chats of its own (this test runs alone when CI reruns it), then Prometheus' scrape of the gateway's counter
    # reaches what the gateway says it counted.
    for _ in range(2):
        assert _chat(deployment, MODEL).status_code == 200
    counted = _gateway_requests(deployment)
    assert counted >= 2, counted
    series = f'sum(vstack_gateway_requests_total{{model="{MODEL}",status="200"}})'
    try:  # 120 s: scrapes run late on a loaded 2-core host
        _wait(f"gateway request counter scraped at {counted:.0f}", lambda: _query(prom, f"{series} >= {counted}"), 120)
    except AssertionError:
        gateway = docker_client.containers.get(f"{PROJECT}-gateway-1")
        print("prometheus has:", _query(prom, series), "the gateway counts now:", _gateway_requests(deployment),
              "gateway restarts:", gateway.attrs["RestartCount"], "started:", gateway.attrs["State"]["StartedAt"])
        _print_discovery(deployment, prom)
        raise
    # The engine is scraped through the gateway (/metrics/targets service discovery): vLLM's own metrics.
    try:
        engine = _wait("engine metrics scraped through the gateway",
                       lambda: _query(prom, f'vllm:generation_tokens_total{{model_name="{MODEL}"}} > 0'), 90)
    except AssertionError:
        _print_discovery(deployment, prom)
        raise
    assert engine[0]["metric"]["job"] == "engines"
    targets = httpx.get(f"{prom}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    health = {(t["labels"]["job"], t["labels"].get("model_group")): t["health"] for t in targets}
    assert health[("gateway", None)] == "up" and health[("engines", MODEL)] == "up", health


def test_every_dashboard_query_evaluates_in_prometheus(deployment: Deployment, docker_client: Any) -> None:
    """Each panel's PromQL is valid against the real Prometheus, and the panels a healthy deployment must
    fill (requests, latency, TTFT, tokens, KV cache, queue, deployment state) have data."""
    prom = _prometheus(deployment, docker_client)
    must_have = ["vstack_gateway_requests_total[", "vstack_gateway_request_duration_seconds_bucket",
                 "vstack_gateway_tokens_total", "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting",
                 "vllm:time_to_first_token_seconds_bucket", "vstack_gateway_deployment_up)"]
    assert _chat(deployment, MODEL).status_code == 200  # data of its own: CI reruns a failed test alone

    # rate() needs two scrapes of a series: right after the first requests there may be one.
    deadline = time.monotonic() + 60
    while True:
        results = {expr: _query(prom, expr.replace("$__rate_interval", "1m")) for expr in dashboard_queries()}
        missing = [m for m in must_have if all(m not in e for e, rows in results.items() if rows)]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(5)
    print("dashboard queries without data on a healthy deployment:",
          *[e for e, rows in results.items() if not rows], sep="\n  ")
    assert missing == []


def test_grafana_is_healthy_with_the_dashboard_provisioned(deployment: Deployment) -> None:
    if not deployment.grafana:
        pytest.skip("no Grafana image on this machine and no registry to pull one from: set "
                    "VSTACK_DOCKER_GRAFANA_IMAGE to a local image; the dashboard's queries are checked above")
    auth = ("admin", deployment.env["GRAFANA_ADMIN_PASSWORD"])
    base = "http://127.0.0.1:13000"
    _wait("grafana healthy", lambda: httpx.get(f"{base}/api/health", timeout=5).json()["database"] == "ok", 120)
    found = _wait("dashboard provisioned",
                  lambda: httpx.get(f"{base}/api/search", params={"query": "vllm-stack"}, auth=auth, timeout=5).json(),
                  60)
    assert "vllm-stack" in {d["uid"] for d in found}
    ds = httpx.get(f"{base}/api/datasources/uid/vstack-prometheus/health", auth=auth, timeout=10).json()
    assert ds["status"] == "OK", ds


def _chat(deployment: Deployment, model: str):
    from openai import OpenAI

    client = OpenAI(base_url=f"{deployment.gateway}/v1", api_key=deployment.api_key, timeout=300, max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24, temperature=0)


def test_switch_models_through_the_admin_api(deployment: Deployment, docker_client: Any) -> None:
    """The model manager switches to the other model: a new engine container starts (the first is stopped
    and removed: one at a time on this CPU) and answers."""
    http = httpx.Client(base_url=deployment.gateway, headers=deployment.admin(), timeout=900)
    started = time.monotonic()
    done = http.post(f"/admin/models/{OTHER}/switch")
    assert done.status_code == 200, done.text
    print(f"switch {MODEL} -> {OTHER}: {time.monotonic() - started:.0f} s")
    models = {m["model"]: m for m in http.get("/admin/models").json()["models"]}
    assert models[OTHER]["state"] == "ready", models[OTHER]
    assert models[MODEL]["state"] != "ready", models[MODEL]
    raw = _chat(deployment, OTHER)
    assert raw.parse().model == OTHER and "Paris" in (raw.parse().choices[0].message.content or "")
    http.close()
    assert [(c.name, c.status) for c in _engine_containers(docker_client)] == [(f"{ENGINE_PREFIX}{OTHER}", "running")]


def test_down_removes_the_engine_a_killed_gateway_left(deployment: Deployment, docker_client: Any) -> None:
    """The gateway killed (it cannot stop its engine): `down --remove-orphans` still finds the engine by the
    compose labels it carries, and leaves no container, network or volume behind."""
    docker_client.containers.get(f"{PROJECT}-vstack-cpu-1").kill()
    assert [c.status for c in _engine_containers(docker_client)] == ["running"]
    down = deployment.compose.run("down", "-v", "--remove-orphans", "--timeout", "20", timeout=300)
    assert f"{ENGINE_PREFIX}{OTHER}" in down.stdout + down.stderr  # compose itself removed it
    label = {"label": f"com.docker.compose.project={PROJECT}"}
    assert docker_client.containers.list(all=True, filters=label) == []
    assert docker_client.networks.list(filters=label) == []
    assert docker_client.volumes.list(filters=label) == []
    assert docker_client.volumes.get(KEPT_CACHE).name == KEPT_CACHE  # external: `down -v` leaves it
    leftovers = [c.name for c in docker_client.containers.list(all=True) if c.name.startswith(PROJECT)]
    assert leftovers == []


def test_env_file_is_not_in_any_image(built_images: dict[str, str], docker_client: Any, tmp_path: Path) -> None:
    """The keys of this run must not appear in image config (env, labels, history)."""
    for image in built_images.values():
        attrs = docker_client.images.get(image).attrs
        text = str(attrs["Config"]) + str(docker_client.api.history(image))
        assert "sk-test-" not in text and "adm-test-" not in text
        assert not any(k in text for k in ("VSTACK_API_KEY=", "VSTACK_ADMIN_KEY=", "HF_TOKEN="))
