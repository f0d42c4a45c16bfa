"""Engines an earlier gateway of this state folder started and left running (killed with SIGKILL, crashed,
or replaced by `vstack reload`'s plan): found by their records (stack.engine.records), re-attached when their
rendered command matches the plan (ModelPlan.fingerprint), stopped when it does not, forgotten when their
process has exited (adr/0023).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from pathlib import Path

import psutil

from stack.engine.process import EngineProcess, stop_process_tree
from stack.engine.records import EngineRecord, RecordStore, engine_records
from stack.engine.runtime import with_port

log = logging.getLogger("stack.engine.kept")


def tree_pids(pid: int) -> set[int]:
    try:
        root = psutil.Process(pid)
        return {pid, *(c.pid for c in root.children(recursive=True))}
    except psutil.Error:
        return set()


def kept_pids(state_dir: Path) -> frozenset[int]:
    """Every process of the running engines this state folder's records name (to count their memory as
    free when planning the engines that may take them over: stack.hardware.detect)."""
    pids: set[int] = set()
    for record in engine_records(state_dir).all():
        if record.alive():
            pids |= tree_pids(record.pid)
    return frozenset(pids)


def leftovers(state_dir: Path) -> list[EngineRecord]:
    """Records of engines still running whose gateway is gone."""
    return [r for r in engine_records(state_dir).all() if r.alive() and not _owner_alive(r)]


def _owner_alive(record: EngineRecord) -> bool:
    """The gateway that started (or last re-attached) it still runs: not a pid recycled since."""
    if not record.owner:
        return False
    try:
        owner = psutil.Process(record.owner)
        return owner.status() != psutil.STATUS_ZOMBIE and owner.create_time() <= record.attached_at + 1
    except psutil.Error:
        return False


def reattach(engine: EngineProcess, grace: float = 20) -> str:
    """Before the first start of `engine` (whose records and fingerprint are set): take over the running
    engine of the same name if its command matches, else stop it; '' when there was none. Says what it did."""
    store: RecordStore | None = engine.records
    if store is None:
        return ""
    record = store.get(engine.spec.name)
    if record is None:
        return ""
    if not record.alive():
        store.remove(record.name)
        return f"engine {record.name!r}: its process (pid {record.pid}) had exited; starting it fresh"
    if _owner_alive(record):
        return ""  # another gateway of this state folder still owns it: `vstack up` refuses before this
    if record.fingerprint != engine.fingerprint:
        left = stop_process_tree(record.pid, grace)
        if not left:
            store.remove(record.name)
        return (f"engine {record.name!r}: pid {record.pid} runs another command than the plan; stopped it"
                + (f" (pids {left} did not exit)" if left else "") + ", starting it fresh")
    engine.spec = with_port(engine.spec, record.port)
    if record.api_key:  # it answers the key it was started with, not the one this plan drew
        engine.spec = dataclasses.replace(engine.spec, api_key=record.api_key)
    engine.kept = record
    engine.log_start = _size(engine.spec.log_path)
    asleep = f", asleep at level {record.asleep} (woken by the manager)" if record.asleep else ""
    return f"engine {record.name!r}: re-attached pid {record.pid} on port {record.port} (same command{asleep})"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


KEEP_FLAG = "keep-engines"  # written by `vstack down --keep-engines` before it stops the gateway


def keep_requested(state_dir: Path) -> bool:
    """The gateway is being stopped with its engines kept (`vstack down --keep-engines`)."""
    return (state_dir / KEEP_FLAG).is_file()


KEEP_ASLEEP_FLAG = "keep-asleep"  # written by a plain `vstack down` (manager.down_keeps_asleep) before it stops
DOWN_REPORT = "down-report.json"  # what the gateway's shutdown kept asleep or stopped, and why: `down` prints it


def keep_asleep_requested(state_dir: Path) -> bool:
    """The gateway is being stopped by `vstack down` with its sleep-capable engines kept asleep (adr/0030)."""
    return (state_dir / KEEP_ASLEEP_FLAG).is_file()


def kept_asleep(state_dir: Path) -> list[EngineRecord]:
    """Records of engines asleep with no gateway: what a plain `vstack down` kept and `--all` releases."""
    return [r for r in leftovers(state_dir) if r.asleep]


def stop_leftovers(state_dir: Path, grace: float, spare: frozenset[str] = frozenset()
                   ) -> tuple[list[EngineRecord], list[int]]:  # fmt: skip
    """Stop every engine of this state folder no live gateway owns (but those named in `spare`: about to be
    re-attached); forget records of exited ones. Returns the records stopped and the pids that would not exit."""
    store = engine_records(state_dir)
    stopped, left = [], []
    for record in store.all():
        if record.name in spare or (record.alive() and _owner_alive(record)):
            continue
        if record.alive():
            stuck = stop_process_tree(record.pid, grace)
            left += stuck
            stopped.append(record)
            if stuck:
                continue
        store.remove(record.name)
    return stopped, left


def write_down_report(state_dir: Path, notes: list[str]) -> None:
    """What the gateway's shutdown kept asleep or stopped, and why: `vstack down` prints it once it has exited."""
    if notes:
        with contextlib.suppress(OSError):  # a full disk: `down` still lists the kept engines from their records
            (state_dir / DOWN_REPORT).write_text(json.dumps(notes))


def read_down_report(state_dir: Path) -> list[str]:
    path = state_dir / DOWN_REPORT
    try:
        notes = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    path.unlink(missing_ok=True)
    return [str(n) for n in notes] if isinstance(notes, list) else []
