"""How long each test file took, kept for the next run's order and printed at the end (adr/0038).

Every phase of every test (setup, call, teardown) is added to its file, in the process that reports (the
xdist controller receives its workers' reports). At the end the ten slowest files and the total are printed,
and the file times are written to `.pytest_cache/vstack/file-seconds.json`, which the next run reads to hand out
the longest files first (tests/conftest.py). `tests/file-seconds.json` is the committed copy a fresh
clone starts from: `python .ci/file_seconds.py` refreshes it from the last whole run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "tests" / "file-seconds.json"
CACHE_KEY = "vstack/file-seconds"


def file_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def known_seconds(config: pytest.Config) -> dict[str, float]:
    """The last run's seconds per file (this checkout's cache), else the committed ones."""
    cache = getattr(config, "cache", None)  # none under -p no:cacheprovider
    cached = cache.get(CACHE_KEY, None) if cache is not None else None
    if cached:
        return cached
    try:
        return json.loads(COMMITTED.read_text())
    except (OSError, ValueError):
        return {}


class FileSeconds:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds: dict[str, float] = {}
        self.started = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        path = file_of(report.nodeid)
        self.seconds[path] = self.seconds.get(path, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.seconds or getattr(self.config, "cache", None) is None:
            return
        # Only a run of (nearly) the whole suite replaces what the ordering knows; one file's run adds to it.
        merged = {**known_seconds(self.config), **{k: round(v, 1) for k, v in self.seconds.items()}}
        self.config.cache.set(CACHE_KEY, merged)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.seconds:
            return
        wall = time.monotonic() - self.started
        slowest = sorted(self.seconds.items(), key=lambda kv: -kv[1])[:10]
        terminalreporter.section("the ten slowest files (seconds, all phases)")
        for path, secs in slowest:
            terminalreporter.write_line(f"{secs:8.1f}  {path}")
        total = sum(self.seconds.values())
        terminalreporter.write_line(f"test time {total:.0f} s over {len(self.seconds)} files; wall {wall:.0f} s")


def register(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without workers) sees every report
        config.pluginmanager.register(FileSeconds(config), "vstack-file-seconds")
