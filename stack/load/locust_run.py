"""Run loadtests/locustfile.py headless in a child process, with CSV and HTML output, and watch it go."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stack.errors import ExitCode, StackError
from stack.load.measured_requests import RECORDS_ENV
from stack.load.scenario import MODELS_ENV, SCENARIO_ENV, Scenario, loadtests_dir


class LoadTestError(StackError):
    """Locust could not run, or ran without sending a single request."""

    exit_code = ExitCode.LOAD_TEST


@dataclass
class LocustRun:
    out_dir: Path
    records: Path
    csv_prefix: Path
    html: Path
    log: Path
    returncode: int
    seconds: float

    def files(self) -> dict[str, str]:
        found = {"records": self.records, "locust_html": self.html, "locust_log": self.log,
                 "locust_stats_csv": Path(f"{self.csv_prefix}_stats.csv"),
                 "locust_history_csv": Path(f"{self.csv_prefix}_stats_history.csv")}
        return {k: p.name for k, p in found.items() if p.exists()}


def locust_command(scenario: Scenario, base_url: str, out_dir: Path, duration_s: float | None) -> list[str]:
    load = scenario.load
    users = load.peak_users
    spawn_rate = users / load.ramp_s if load.ramp_s else users
    run_time = duration_s or load.total_s
    # In-flight requests may finish after the run time (--stop-timeout) so the last ones are not cut off.
    stop_timeout = int(min(60, scenario.requests.timeout_s))
    return [
        sys.executable, "-m", "locust", "-f", str(loadtests_dir() / "locustfile.py"), "--headless",
        "--host", base_url.rstrip("/"), "-u", str(users), "-r", f"{spawn_rate:g}",
        "-t", f"{math.ceil(run_time)}s", "--stop-timeout", str(stop_timeout),
        "--csv", str(out_dir / "locust"), "--csv-full-history", "--html", str(out_dir / "locust.html"),
        "--only-summary", "--loglevel", "WARNING", "--exit-code-on-error", "0",
        # The report checks the SLO (--slo, the scenario's, the profile's), not the locustfile's own check.
        "--slo", "none",
    ]


def run_locust(
    scenario: Scenario,
    scenario_file: Path,
    base_url: str,
    out_dir: Path,
    duration_s: float | None = None,
    on_tick: Callable[[float, int, int], None] = lambda *_: None,
    models: dict[str, float] | None = None,
) -> LocustRun:
    """Blocks until Locust exits; on_tick(elapsed_s, requests_done, errors) about twice a second. models: the
    mix to send (stack.load.target), over the scenario's."""
    out_dir.mkdir(parents=True, exist_ok=True)
    records = out_dir / "requests.jsonl"
    records.unlink(missing_ok=True)
    log = out_dir / "locust.log"
    env = {**os.environ, SCENARIO_ENV: str(scenario_file.resolve()), RECORDS_ENV: str(records),
           "PYTHONUNBUFFERED": "1", MODELS_ENV: json.dumps(models or {})}
    cmd = locust_command(scenario, base_url, out_dir, duration_s)
    started = time.monotonic()
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        try:
            while proc.poll() is None:
                done, errors = _count(records)
                on_tick(time.monotonic() - started, done, errors)
                time.sleep(0.5)
        except BaseException:
            proc.terminate()  # Ctrl-C: Locust writes its CSV and HTML on SIGTERM too
            proc.wait(timeout=30)
            raise
    run = LocustRun(out_dir, records, out_dir / "locust", out_dir / "locust.html", log, proc.returncode,
                    time.monotonic() - started)
    if proc.returncode not in (0, 1) or not records.exists():  # 1 = some requests failed: the report says which
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise LoadTestError(f"Locust exited with code {proc.returncode} and recorded no requests:\n{tail}",
                            hint=f"read {log}; is the endpoint {base_url} up?")
    return run


def _count(records: Path) -> tuple[int, int]:
    try:
        data = records.read_bytes()
    except OSError:
        return 0, 0
    return data.count(b"\n"), data.count(b'"ok":false')
