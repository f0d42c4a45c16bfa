"""Deployments and adapters added through /admin survive a gateway restart: kept in `state_dir/runtime.json`.

Each change through /admin/deployments or /admin/adapters rewrites the file (written beside it, then
renamed over it: a crash or a full disk never leaves half a file). At start, once the engines are
registered, every entry is added again through the same checks as the admin call that made it: one that no
longer passes (an adapter folder gone, a provider key no longer allowed) is skipped with its reason. The
log and /admin/models (`gateway.runtime_state`) say what was restored and what was skipped, and a write
that failed (disk full) is reported there and in the admin call's answer, not swallowed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("stack.gateway.runtime_state")
VERSION = 1


class RuntimeState:
    def __init__(self, path: Path | None) -> None:
        self.path = path  # None: nothing is persisted (a gateway without a state_dir)
        self.deployments: dict[str, dict[str, Any]] = {}  # id -> the /admin/deployments body
        self.adapters: dict[str, dict[str, Any]] = {}  # name -> the /admin/adapters body
        self.restored: list[str] = []
        self.skipped: list[dict[str, str]] = []
        self.write_error = ""

    def read(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """(deployments, adapters) the file holds; empty when there is none. A file that cannot be read is
        reported (skipped) and left in place for the operator."""
        if self.path is None or not self.path.is_file():
            return {}, {}
        try:
            data = json.loads(self.path.read_text())
            return dict(data.get("deployments") or {}), dict(data.get("adapters") or {})
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            self.skipped.append({"what": str(self.path), "why": f"unreadable ({type(exc).__name__}); left as is"})
            log.error("runtime state %s is unreadable (%s); starting without it", self.path, exc)
            return {}, {}

    def set_deployment(self, dep_id: str, spec: dict[str, Any] | None) -> bool:
        self._set(self.deployments, dep_id, spec)
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
        body = json.dumps({"version": VERSION, "deployments": self.deployments, "adapters": self.adapters},
                          indent=1, sort_keys=True).encode()  # fmt: skip
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
                "deployments": sorted(self.deployments), "adapters": sorted(self.adapters),
                "restored": self.restored, "skipped": self.skipped, "write_error": self.write_error or None}

