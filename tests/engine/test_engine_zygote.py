"""The suite's engine zygote (stack.engine.zygote, adr/0038) forks our launcher's `serve`, reports the exit code as
Popen would, and leaves every other start to Popen: what the suite's engine tests rely on for their time."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from bench.harness import models
from bench.harness.stack_engine import rendered_engine
from bench.harness.waiting import free_port
from stack.engine.process import EngineProcess, EngineSpec
from stack.engine.zygote import ZYGOTE_ENV, ForkedEngine, same_code
from tests.support import engine_zygote

pytestmark = pytest.mark.e2e


def spec_for(tmp_path: Path, name: str, **env: str) -> EngineSpec:
    port = free_port()
    argv, engine_env = rendered_engine(models.smollm2_dir(), name, port, max_model_len=256, max_num_seqs=2)
    return EngineSpec(name=name, profile="t", argv=argv, env={**engine_env, **env}, host="127.0.0.1", port=port,
                      log_path=tmp_path / f"{name}.log", display_argv=argv, api_key="zygote-test-key")  # fmt: skip


def test_the_zygote_forks_the_launcher_which_serves_and_whose_kill_is_reported(tmp_path: Path) -> None:
    zygote = engine_zygote.ready(timeout=180)
    if zygote is None:
        pytest.skip(f"no engine zygote in this process ({ZYGOTE_ENV} set by hand, or it exited: read its log)")
    engine = EngineProcess(spec_for(tmp_path, "forked"))
    pid = engine.start()
    try:
        assert isinstance(engine.popen, ForkedEngine) and psutil.Process(pid).ppid() == zygote
        engine.wait_ready(240)
        assert "stack.vllm.launcher serve" in " ".join(psutil.Process(pid).cmdline())  # `ps` shows the engine
        reply = httpx.post(f"{engine.spec.base_url}/v1/completions", timeout=60,
                           headers={"Authorization": "Bearer zygote-test-key"},
                           json={"model": "forked", "prompt": "The capital of France is", "max_tokens": 4,
                                 "temperature": 0})  # fmt: skip
        assert reply.status_code == 200 and "Paris" in reply.json()["choices"][0]["text"]
        assert "Application startup complete" in engine.spec.log_path.read_text()  # its output went to its log
        os.kill(pid, signal.SIGKILL)
        assert engine.popen.wait(30) == -signal.SIGKILL  # as Popen says it: the zygote reaped it
    finally:
        engine.stop(grace=5)


def test_an_engine_whose_import_time_environment_differs_is_execd(tmp_path: Path) -> None:
    if engine_zygote.ready(timeout=180) is None:
        pytest.skip("no engine zygote in this process")
    engine = EngineProcess(spec_for(tmp_path, "execd", HF_HOME=str(tmp_path)))  # read by huggingface_hub at import
    try:
        engine.start()
        assert not isinstance(engine.popen, ForkedEngine)
    finally:
        engine.stop(grace=5)
    assert same_code(str(Path(__file__).resolve().parents[2])) and not same_code(str(tmp_path))
    assert not same_code(os.pathsep.join([sys.prefix, str(tmp_path)]))


def test_what_the_zygote_refuses_and_what_it_lets_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """Import-time variables must match the zygote's; those read when used do not (`ray.init` sets
    PYTHONBREAKPOINT in a test process: in CI11 every later engine of that worker was exec'd for it)."""
    from stack.engine import zygote

    monkeypatch.setattr(zygote, "STARTED_WITH", {"PATH": "/bin", "HF_HOME": "/hub"})
    argv = [sys.executable, *zygote.LAUNCHER, "model"]
    env = {"PATH": "/bin", "HF_HOME": "/hub"}
    assert zygote.refusal({"argv": argv, "env": {**env, "PYTHONBREAKPOINT": "ray.util.rpdb._driver_set_trace",
                                                 "TORCHINDUCTOR_CACHE_DIR": "/c", "HF_HUB_OFFLINE": "1"}}) == ""
    differs = zygote.refusal({"argv": argv, "env": {**env, "HF_HOME": "/other"}})
    assert differs == "import-time variables differ: HF_HOME"
    assert zygote.refusal({"argv": ["/usr/bin/python3", *argv[1:]], "env": env}).startswith("not ")
