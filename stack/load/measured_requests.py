"""One line of JSON per request: what the locustfile measured, read back by the report.

Locust's own statistics round response times into buckets; the SLO report needs exact percentiles and
time series, so every request is also written here as it finishes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

RECORDS_ENV = "VSTACK_LOADTEST_RECORDS"  # where the locustfile appends its records


@dataclass
class RequestRecord:
    start: float  # epoch seconds when the request was sent
    model: str
    stream: bool
    ok: bool
    e2e_ms: float
    ttft_ms: float | None = None  # streamed requests only: first content chunk
    itl_ms: list[float] = field(default_factory=list)  # gaps between content chunks
    prompt_tokens: int = 0
    output_tokens: int = 0
    status: int = 0
    error: str = ""

    @property
    def end(self) -> float:
        return self.start + self.e2e_ms / 1000

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token after the first (vLLM's TPOT)."""
        if self.ttft_ms is None or self.output_tokens < 2:
            return None
        return (self.e2e_ms - self.ttft_ms) / (self.output_tokens - 1)


class RecordWriter:
    """Appends records; line-buffered so a killed run still leaves every finished request on disk."""

    def __init__(self, path: Path | str) -> None:
        self._file: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the Locust run

    def write(self, record: RequestRecord) -> None:
        data = asdict(record)
        data["itl_ms"] = [round(x, 3) for x in record.itl_ms]
        self._file.write(json.dumps(data, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._file.close()


def writer_from_env() -> RecordWriter | None:
    path = os.environ.get(RECORDS_ENV)
    return RecordWriter(path) if path else None


def read_records(path: Path) -> Iterator[RequestRecord]:
    if not path.is_file():
        return
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                yield RequestRecord(**json.loads(line))
