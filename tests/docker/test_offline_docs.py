"""The documented offline Compose path (docs/getting-started/docker-compose.md, "Offline / no registry") is
the one CI's Docker tests take (issue 50, item 3): the same variables with the same values, the same local
images docker/ci-setup.sh makes, the same wheel port, the same compose commands and services. Read from the
files; no Docker needed, no image built (tests/docker/test_compose.py runs that path for real)."""

from __future__ import annotations

import re

from tests.docker.conftest import COMPOSE_FILE, ROOT, build_env
from tests.docker.test_compose import SERVICES_WITHOUT_GRAFANA

DOC = ROOT / "docs" / "getting-started" / "docker-compose.md"


def offline_section() -> str:
    text = DOC.read_text()
    start = text.index("## Offline / no registry")
    return text[start : text.index("\n## ", start + 1)]


def test_the_docs_offline_variables_are_what_the_docker_tests_set() -> None:
    section = offline_section()
    exported = dict(re.findall(r"^export (\w+)=(\S*)", section, re.M))
    # What tests/docker/conftest.py sets from docker/ci-setup.sh's images and the wheel folder it serves.
    images = {"VSTACK_DOCKER_BASE_IMAGE": exported["PYTHON_BASE_IMAGE"],
              "VSTACK_DOCKER_PROMETHEUS_IMAGE": exported["PROMETHEUS_IMAGE"]}  # fmt: skip
    ci = build_env(images, exported["PIP_FIND_LINKS"])
    assert exported == ci
    setup = (ROOT / "docker" / "ci-setup.sh").read_text()
    assert f"base_image=${{VSTACK_DOCKER_BASE_IMAGE:-{exported['PYTHON_BASE_IMAGE']}}}" in setup
    assert f"prom_image={exported['PROMETHEUS_IMAGE']}" in setup
    conftest = (ROOT / "tests" / "docker" / "conftest.py").read_text()
    port = re.search(r'"VSTACK_DOCKER_WHEELS_PORT", "(\d+)"', conftest)
    assert port and f"http.server {port.group(1)} --bind 127.0.0.1" in section
    assert exported["PIP_FIND_LINKS"] == f"http://127.0.0.1:{port.group(1)}/"
    compose = COMPOSE_FILE.read_text()
    table = re.findall(r"^\| `(\w+)` \|", section, re.M)
    assert set(exported) <= set(table)
    for name in table:  # each one the compose file really reads
        assert re.search(r"\$\{" + name + r"[:\-}]", compose), name


def test_the_docs_offline_commands_are_the_ones_the_docker_tests_run() -> None:
    commands = [line for line in offline_section().splitlines() if line.startswith("docker compose ")]
    base = f"docker compose -f {COMPOSE_FILE.relative_to(ROOT)} --profile cpu"
    assert commands == [f"{base} build", f"{base} up -d --no-build --pull never {' '.join(SERVICES_WITHOUT_GRAFANA)}"]


def test_the_docs_say_where_the_gateway_listens_and_how_to_keep_it_on_this_host() -> None:
    text = " ".join(DOC.read_text().split())
    compose = COMPOSE_FILE.read_text()
    assert '"${GATEWAY_BIND:-0.0.0.0}:${GATEWAY_PORT:-8000}:8000"' in compose
    assert "VSTACK_GATEWAY__HOST=0.0.0.0" in compose
    assert "inside its container it binds `0.0.0.0:8000`" in text
    assert "`${GATEWAY_BIND:-0.0.0.0}:${GATEWAY_PORT:-8000}`" in text and "`GATEWAY_BIND=127.0.0.1`" in text
