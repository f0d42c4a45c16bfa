"""All-or-nothing writes into an installation, with backups, checksums and crash recovery.

Layout beside the installed package: <site>/.vstack-patches/
  state.json          what vstack applied: per patch, per file, sha256 before and after
  txn/journal.json    present only while a transaction runs (or after a crash inside one)
  txn/files/<rel>     the original bytes of every file the running transaction rewrites

The journal is written after every backup, so a journal always has complete backups. state.json is
replaced last and names the transaction it commits: at the next start a journal whose id state.json
already names was committed (only the cleanup was lost); any other journal is rolled back.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stack.files import replace_file
from stack.patches.tool_errors import PatchError

STATE_DIR = ".vstack-patches"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` in one rename, keeping its mode; a reader sees the old or the new file, never half."""
    replace_file(path, data, mode=None, fsync=True)
    # A .pyc compiled from the other content could pass Python's mtime+size check within one second.
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        pyc.unlink(missing_ok=True)


class Store:
    """The state and transaction files of one installation."""

    def __init__(self, site: Path) -> None:
        self.site = site
        self.dir = site / STATE_DIR
        self.state_file = self.dir / "state.json"
        self.txn_dir = self.dir / "txn"
        self.journal = self.txn_dir / "journal.json"

    # -- state ---------------------------------------------------------------------------------------
    def load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {"applied": {}, "last_txn": None}
        except (OSError, ValueError) as e:
            raise PatchError(
                f"{self.state_file}: unreadable ({e})",
                hint="vLLM files may still be patched: reinstall vLLM, then delete that file",
            ) from e
        data.setdefault("applied", {})
        return data

    def _save(self, state: dict[str, Any]) -> None:
        replace_file(self.state_file, json.dumps(state, indent=2, sort_keys=True), mode=None, fsync=True)

    # -- transactions --------------------------------------------------------------------------------
    def interrupted(self) -> bool:
        return self.journal.exists()

    def recover(self) -> str | None:
        """Finish or undo a transaction a crash left behind. Returns what was done, or None."""
        if not self.journal.exists():
            if self.txn_dir.exists():  # crashed before the journal: no file was touched yet
                shutil.rmtree(self.txn_dir)
            return None
        journal = json.loads(self.journal.read_text())
        if self.load().get("last_txn") == journal["id"]:
            shutil.rmtree(self.txn_dir)
            return f"completed the cleanup of committed transaction {journal['id']}"
        self._restore(journal)
        shutil.rmtree(self.txn_dir)
        return f"rolled back interrupted {journal['op']} ({', '.join(journal['files'])})"

    def _restore(self, journal: dict[str, Any]) -> None:
        for rel in journal["files"]:
            atomic_write(self.site / rel, (self.txn_dir / "files" / rel).read_bytes())

    def commit(
        self,
        op: str,
        new: dict[str, bytes],
        update_state: Callable[[dict[str, Any]], None],
        *,
        _after_write: Callable[[str], None] | None = None,
    ) -> None:
        """Write every file of `new` and the updated state, or none of them."""
        if self.interrupted():
            raise PatchError(
                f"{self.journal}: an earlier transaction is unfinished", hint="run the command again"
            )
        old = {rel: (self.site / rel).read_bytes() for rel in new}
        txn_id = uuid.uuid4().hex[:12]
        if self.txn_dir.exists():
            shutil.rmtree(self.txn_dir)
        for rel, data in old.items():
            dest = self.txn_dir / "files" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            _fsync_write(dest, data)
        journal = {
            "id": txn_id,
            "op": op,
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "files": {rel: {"before": sha256(old[rel]), "after": sha256(new[rel])} for rel in new},
        }
        _fsync_write(self.journal, json.dumps(journal, indent=2).encode())
        try:
            for rel, data in new.items():
                atomic_write(self.site / rel, data)
                if _after_write:
                    _after_write(rel)
            for rel, data in new.items():
                if sha256((self.site / rel).read_bytes()) != sha256(data):
                    raise PatchError(f"{self.site / rel}: checksum differs after writing")
            state = self.load()
            update_state(state)
            state["last_txn"] = txn_id
            self._save(state)
        except BaseException as e:
            self._restore(journal)
            shutil.rmtree(self.txn_dir)
            raise PatchError(
                f"{op} failed at {type(e).__name__}: {e}; every file was restored from its backup",
                hint="nothing changed; fix the cause and run it again",
            ) from e
        shutil.rmtree(self.txn_dir)
