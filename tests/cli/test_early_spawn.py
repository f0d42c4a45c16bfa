"""The default engine spawned by the gateway process before its imports (stack.engine.early_spawn, issue 37).

The gateway process here is the real one (`python -m stack.entrypoints.run stack.cli.gateway_process`, as `vstack
up` starts it) with the plan and the stdin `vstack up` hands it. The engine is a stand-in Python (the plan's
`engine_python`: a shell script that writes its pid and sleeps) so that what is checked is who spawned what:
one engine process, the gateway's child, with the plan's command and key, recorded, and stopped with the
gateway; a spec that is not the plan's own is stopped and the engine started as before; a gateway that fails
before taking the early engine over leaves none behind. `vstack up` with a real vLLM goes through the same path
in every `vstack up` test (tests/cli/test_up_down.py); its seconds are measured by bench/startup_time.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from stack.config import load_config
from stack.engine import early_spawn
from stack.engine.launch import early_payload
from stack.engine.ports import free_port
from stack.engine.records import engine_records
from stack.hardware import HardwareInfo
from stack.planner.stack_planner import plan_stack
from tests.conftest import load_catalog
from tests.support.processes import kill_strays

ROOT = Path(__file__).resolve().parents[2]
CPU = HardwareInfo(cpu_count=2, ram_total=16 << 30, ram_available=8 << 30)
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 64,
        "vocab_size": 49152, "max_position_embeddings": 2048, "torch_dtype": "float32"}  # fmt: skip


@pytest.fixture(autouse=True)
def _no_strays() -> Iterator[None]:
    yield from kill_strays()


def planned(tmp_path: Path):
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY))
    fake = tmp_path / "engine-python"
    # Its pid and argv; it sleeps as an engine would serve, and answers the planner's questions to vLLM's Python
    # (where vLLM is, its parsers) as a Python without vLLM would: at once, with nothing.
    fake.write_text(f"#!/bin/sh\necho \"$$ $*\" >> {tmp_path / 'spawned'}\n"
                    "case \"$*\" in *stack.vllm.launcher*) exec sleep 120;; esac\nexit 1\n")
    fake.chmod(0o755)
    dirs = f"state_dir: {tmp_path / 'state'}\ncache_dir: {tmp_path / 'cache'}\n"
    model_yaml = f"models:\n  tiny: {{source: {{path: {model}}}}}\nserve: tiny\n"
    cfg = load_config(text=f"{model_yaml}engine_python: {fake}\n{dirs}")
    plan = plan_stack(cfg, None, CPU, load_catalog("0.32"))
    plan.save(tmp_path / "state" / "plan.json")
    return cfg, plan


def gateway(tmp_path: Path, handed: dict, plan_file: Path | None = None) -> subprocess.Popen[bytes]:
    plan_file = plan_file or tmp_path / "state" / "plan.json"
    argv = [sys.executable, "-m", "stack.entrypoints.run", "stack.cli.gateway_process", "--plan", str(plan_file),
            "--secrets-stdin", "--port", str(free_port())]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("VSTACK_")}
    env["PYTHONPATH"] = str(ROOT)
    log = open(tmp_path / "gateway.log", "ab")  # noqa: SIM115 (the child holds it)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                            start_new_session=True)  # fmt: skip
    proc.stdin.write(json.dumps(handed).encode())  # type: ignore[union-attr]
    proc.stdin.close()  # type: ignore[union-attr]
    return proc


def wait_for(tmp_path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        log = (tmp_path / "gateway.log").read_text(errors="replace") if (tmp_path / "gateway.log").exists() else ""
        if text in log:
            return log
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in the gateway's log:\n{log}")


def spawned(tmp_path: Path, at_least: int = 0) -> list[tuple[int, str]]:
    """(pid, arguments) of every engine the stand-in Python ran (not the gateway's questions to it: vLLM's path).
    `at_least`: wait up to 30 s for that many: the gateway logs a spawn once it forked, the stand-in writes its line
    when the shell runs, which a loaded machine delays (CI, 2026-11-30: the second engine's line came after)."""
    path = tmp_path / "spawned"
    end = time.monotonic() + 30
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        ours = [line.split(" ", 1) for line in lines if "stack.vllm.launcher serve" in line]
        if len(ours) >= at_least or time.monotonic() > end:
            return [(int(pid), args) for pid, args in ours]
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM as `vstack down` sends it (what is left after it, `down` kills: kill_strays does here)."""
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)


def test_the_gateway_spawns_the_drawn_engine_first_and_takes_it_over(tmp_path: Path) -> None:
    cfg, plan = planned(tmp_path)
    early = early_payload(plan, cfg)
    assert early is not None
    proc = gateway(tmp_path, {"secrets": plan.secrets(), early_spawn.KEY: early})
    try:
        log = wait_for(tmp_path, "before its imports", proc)
        [(pid, args)] = spawned(tmp_path, at_least=1)  # one engine process: the early one, not a second start
        engine = psutil.Process(pid)
        assert engine.ppid() == proc.pid
        assert f"--port {early['spec']['port']}" in args and args.split() == early["spec"]["argv"][1:]
        record = engine_records(cfg.state_dir).get(plan.default.served_name)
        assert record is not None and record.pid == pid and record.port == early["spec"]["port"]
        assert record.fingerprint == plan.default.fingerprint and record.api_key == early["spec"]["api_key"]
        assert engine.environ()["VLLM_API_KEY"] == early["spec"]["api_key"]
        assert early["spec"]["api_key"] not in log  # the key never reaches a log
        assert "early spawn" not in log  # adopted: no warning
    finally:
        stop(proc)


def test_a_spec_that_is_not_the_plans_is_stopped_and_the_engine_started_as_before(tmp_path: Path) -> None:
    cfg, plan = planned(tmp_path)
    early = early_payload(plan, cfg)
    assert early is not None
    early["spec"]["argv"] = [*early["spec"]["argv"], "--max-num-seqs", "999"]  # not what the plan runs
    proc = gateway(tmp_path, {"secrets": plan.secrets(), early_spawn.KEY: early})
    try:
        log = wait_for(tmp_path, "spawned", proc)
        assert "early spawn of engine tiny not used (its command is not the plan's)" in log
        (first, tampered), (second, args) = spawned(tmp_path, at_least=2)
        assert "999" in tampered and "999" not in args
        assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
        assert psutil.Process(second).ppid() == proc.pid
    finally:
        stop(proc)


def test_a_gateway_that_fails_before_taking_it_over_leaves_no_engine(tmp_path: Path) -> None:
    cfg, plan = planned(tmp_path)
    early = early_payload(plan, cfg)
    broken = tmp_path / "broken-plan.json"
    broken.write_text(json.dumps({"version": -1}))  # a plan this vstack cannot read: a configuration error
    proc = gateway(tmp_path, {"secrets": plan.secrets(), early_spawn.KEY: early}, plan_file=broken)
    assert proc.wait(60) == 2
    [(pid, _args)] = spawned(tmp_path, at_least=1)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_nothing_is_drawn_where_an_engine_of_that_name_runs_to_be_re_attached(tmp_path: Path) -> None:
    cfg, plan = planned(tmp_path)
    from stack.engine.records import EngineRecord

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        engine_records(cfg.state_dir).save(EngineRecord(plan.default.served_name, "p", sleeper.pid, "127.0.0.1", 1,
                                                        "", [], time.time(), plan.default.fingerprint))  # fmt: skip
        assert early_payload(plan, cfg) is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_process_age_is_read_from_the_kernels_clocks_not_a_whole_second_boot_time() -> None:
    """The spawn line's "N s after the gateway process began": psutil's create_time read ~1 s too much here."""
    code = "from stack.assemble.runtimes import process_age; print(process_age())"
    t = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    wall = time.monotonic() - t
    assert 0 < float(done.stdout) < wall
