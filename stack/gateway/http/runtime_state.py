"""Deployments, adapters and named keys added through /admin survive a restart: kept in `state_dir/runtime.json`.

Each change through /admin/deployments or /admin/adapters rewrites the file (written beside it, then
renamed over it: a crash or a full disk never leaves half a file). At start, once the engines are
registered, every entry is added again through the same checks as the admin call that made it: one that no
longer passes (an adapter folder gone, a provider key no longer allowed, a string that is not text) is skipped
with its reason and stays in the file until removed (`vstack deployments rm ID`). A file that cannot be read
is moved aside (runtime.json.unreadable-TIME), never written over. The
log and /admin/models (`gateway.runtime_state`) say what was restored and what was skipped, and a write
that failed (disk full) is reported there and in the admin call's answer, not swallowed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("stack.gateway.runtime_state")
VERSION = 1


class RuntimeState:
    def __init__(self, path: Path | None) -> None:
        self.path = path  # None: nothing is persisted (a gateway without a state_dir)
        self.deployments: dict[str, dict[str, Any]] = {}  # id -> the /admin/deployments body
        self.adapters: dict[str, dict[str, Any]] = {}  # name -> the /admin/adapters body
        self.keys: dict[str, dict[str, Any]] = {}  # name -> a named key (its sha256, never the key), or revoked
        self.restored: list[str] = []
        self.skipped: list[dict[str, str]] = []
        self.write_error = ""
        self.stuck = False  # an unreadable file that could not be moved aside: never written over

    def read(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """(deployments, adapters) the file holds; empty when there is none. A file that cannot be read is
        reported (skipped) and left in place for the operator."""
        if self.path is None or not self.path.is_file():
            return {}, {}
        try:
            data = json.loads(self.path.read_text())
            deployments, adapters = dict(data.get("deployments") or {}), dict(data.get("adapters") or {})
            self.keys = dict(data.get("keys") or {})
            return deployments, adapters
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            # Moved aside, never overwritten: the next /admin change writes a new file, the old content stays
            # for the operator to read (adr/0039).
            aside = self.path.with_name(f"{self.path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
            try:
                os.replace(self.path, aside)
                where = f"moved aside to {aside}"
            except OSError as move:
                where = f"left as is ({move.strerror}); the next /admin change will not be saved"
                self.write_error = f"{self.path}: unreadable and could not be moved aside ({move.strerror})"
                self.stuck = True
            self.skipped.append({"what": str(self.path), "why": f"unreadable ({type(exc).__name__}); {where}"})
            log.error("runtime state %s is unreadable (%s); starting without it, %s", self.path, exc, where)
            return {}, {}

    def set_deployment(self, dep_id: str, spec: dict[str, Any] | None) -> bool:
        self._set(self.deployments, dep_id, spec)
        return self.write()

    def set_key(self, name: str, spec: dict[str, Any] | None) -> bool:
        self._set(self.keys, name, spec)
        return self.write()

    def set_adapter(self, name: str, spec: dict[str, Any] | None) -> bool:
        self._set(self.adapters, name, spec)
        return self.write()

    @staticmethod
    def _set(table: dict[str, dict[str, Any]], key: str, spec: dict[str, Any] | None) -> None:
        if spec is None:
            table.pop(key, None)
        else:
            table[key] = spec

    def write(self) -> bool:
        """True when the file now holds every runtime change (or nothing is persisted)."""
        if self.path is None:
            return True
        if self.stuck:
            log.error("runtime change not persisted: %s", self.write_error)
            return False
        body = json.dumps({"version": VERSION, "deployments": self.deployments, "adapters": self.adapters,
                           "keys": self.keys}, indent=1, sort_keys=True).encode()  # fmt: skip
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".runtime-", dir=self.path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(body)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            self.write_error = f"{self.path}: {exc.strerror or type(exc).__name__}"
            log.error("runtime change not persisted (%s): it will be gone after a restart", self.write_error)
            return False
        self.write_error = ""
        return True

    def report(self) -> dict[str, Any]:
        return {"path": str(self.path) if self.path else None, "persisted": self.path is not None,
                "deployments": sorted(map(shown, self.deployments)), "adapters": sorted(map(shown, self.adapters)),
                "keys": sorted(map(shown, self.keys)),
                "restored": self.restored, "skipped": self.skipped, "write_error": self.write_error or None}

    def key_of(self, table: dict[str, dict[str, Any]], name: str) -> str | None:
        """The entry `name` names, also as /admin shows a key that is not text (`shown`): so it can be removed."""
        if name in table:
            return name
        return next((k for k in table if shown(k) == name), None)


def shown(text: str) -> str:
    """A string from the file as an answer can carry it: a lone surrogate written as \\udXXX."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")

