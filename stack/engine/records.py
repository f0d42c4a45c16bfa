"""What `vstack up` started, written to the state folder so `vstack status` and `vstack down` can find it.

Two folders: `engines/` holds the gateway's record (the one process `vstack up` leaves running);
`engine-processes/` holds one record per engine process the gateway started, written when it is spawned and
removed when it is stopped. An engine outlives its gateway (its own session): after a `kill -9` of the
gateway its record is what `status` shows, what `down` stops and what the next `up` re-attaches
(stack.engine.kept, adr/0023).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from stack.files import replace_file


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
    fingerprint: str = ""  # an engine's rendered command, hashed (ModelPlan.fingerprint): "" for the gateway
    owner: int = 0  # the gateway pid that started (or re-attached) the engine
    attached_at: float = field(default_factory=time.time)  # when `owner` took it (a recycled pid is younger)
    # The credential the engine answers (adr/0020): the gateway that re-attaches it must send the same. The
    # file is the owner's alone (0600), like a key file; never shown by status, logs or the console.
    api_key: str = field(default="", repr=False)
    # vLLM sleep level it sleeps at now (0: awake), and the host RAM that sleep holds (its weights at level 1):
    # what `vstack down` keeps (adr/0030) and what a re-attaching gateway must wake before serving it.
    asleep: int = 0
    host_bytes: int = 0

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            # A recycled pid belongs to a process created after ours started.
            running = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE  # killed, not yet reaped
            return running and proc.create_time() <= self.started_at + 5
        except psutil.Error:
            return False


GATEWAYS = "engines"  # the folder's old name: the gateway's record (load tests look there for a target)
ENGINE_PROCESSES = "engine-processes"


class RecordStore:
    def __init__(self, state_dir: Path, folder: str = GATEWAYS) -> None:
        self.dir = state_dir / folder

    def _path(self, name: str) -> Path:
        return self.dir / f"{name.replace('/', '_')}.json"

    def save(self, record: EngineRecord) -> None:
        replace_file(self._path(record.name), json.dumps(asdict(record), indent=2), mode=0o600)  # may hold a key

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


def engine_records(state_dir: Path) -> RecordStore:
    """The records of the engine processes gateways of this state folder started."""
    return RecordStore(state_dir, ENGINE_PROCESSES)
