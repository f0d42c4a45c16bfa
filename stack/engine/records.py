"""What `vstack up` started, written to the state folder so `vstack status` and `vstack down` can find it."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil


@dataclass
class EngineRecord:
    name: str
    profile: str
    pid: int
    host: str
    port: int
    log_path: str
    argv: list[str] = field(default_factory=list)  # redacted
    started_at: float = field(default_factory=time.time)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            # A recycled pid belongs to a process created after ours started.
            return proc.is_running() and proc.create_time() <= self.started_at + 5
        except psutil.Error:
            return False


class RecordStore:
    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "engines"

    def _path(self, name: str) -> Path:
        return self.dir / f"{name.replace('/', '_')}.json"

    def save(self, record: EngineRecord) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self._path(record.name)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(record), indent=2))
        os.replace(tmp, path)

    def remove(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)

    def get(self, name: str) -> EngineRecord | None:
        path = self._path(name)
        try:
            return EngineRecord(**json.loads(path.read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return None

    def all(self) -> list[EngineRecord]:
        if not self.dir.is_dir():
            return []
        records = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                records.append(EngineRecord(**json.loads(path.read_text())))
            except (ValueError, TypeError):
                path.unlink()  # unreadable state is stale state
        return records
