"""The locustfile against a local OpenAI-compatible mock (bench/harness/mock_upstream.py): stages, a model mix,
streamed and plain requests, failures counted and the SLO failed, in seconds and without vLLM; and the plain
`locust -f loadtests/locustfile.py` commands of loadtests/README.md, as written, against the real gateway (in a
thread, with keys on) in front of that mock."""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.harness.gateway_thread import app_in_thread
from bench.harness.waiting import free_port
from tests.load.conftest import stop_locust, write_scenario

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="needs Locust")

MIXED = """\
name: mixed
load:
  ramp_s: 0
  stages: [{users: 1, duration_s: 2}, {users: 3, duration_s: 3}]
models: {mock: 1, status-503: 1}
requests: {stream: 0.5, prompt_tokens: 20, output_tokens: 4}
slo: ["error_rate<0.01"]
"""


@pytest.fixture
def mock_url() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "harness" / "mock_upstream.py"), "--port", str(port),
                             "--chunks", "4", "--delay-ms", "5"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_stages_mix_and_failures(mock_url: str, tmp_path: Path) -> None:
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "stack.entrypoints.cli", "bench", "load", "--scenario",
                           str(write_scenario(tmp_path, MIXED)), "--url", mock_url + "/v1", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 11, proc.stdout + proc.stderr  # the SLO fails: exit 11, the report still written
    assert "FAIL" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    by_model = report["by_model"]
    assert set(by_model) == {"mock", "status-503"}
    assert by_model["status-503"]["ok"] == 0 and by_model["mock"]["errors"] == 0
    assert report["errors"][0]["error"].startswith("HTTP 503: ")
    assert report["slo"]["passed"] is False
    lines = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    ok = [x for x in lines if x["ok"]]
    assert {x["stream"] for x in ok} == {True, False}  # both kinds of request were sent
    assert all(x["output_tokens"] == 4 for x in ok)
    assert all(x["ttft_ms"] is not None and len(x["itl_ms"]) == 3 for x in ok if x["stream"])
    # One user, then three: one request in flight at a time early in the run, several at once later. (Counted
    # in flight, not per second: on 2 busy cores three users of a Python mock finished fewer requests per
    # second than one did, CI's run of stop 47.)
    spans = sorted((x["start"], x["start"] + x["e2e_ms"] / 1000) for x in lines)
    t0 = spans[0][0]

    def in_flight(at: float) -> int:
        return sum(1 for start, end in spans if start <= at < end)

    early = max(in_flight(s) for s, _ in spans if s - t0 < 1.0)  # stage 1 lasts 2 s from Locust's start
    late = max(in_flight(s) for s, _ in spans if s - t0 >= 2.5)
    assert early <= 1 and late >= 2, (early, late)
    assert "## By model" in (out / "report.md").read_text()


SLOW = """\
name: slow
load: {users: 2, ramp_s: 0, duration_s: 120}
requests: {stream: 0, prompt_tokens: 20, output_tokens: 4}
slo: ["error_rate<0.01"]
"""


def test_stopped_early_every_request_sent_is_in_the_report(tmp_path: Path) -> None:
    """A run ended by SIGTERM (as tests end a load once what they measure is done): the requests in flight
    finish and are recorded (the records file once closed before they did), and the report is written."""
    port = free_port()
    mock = subprocess.Popen([sys.executable, str(REPO / "bench" / "harness" / "mock_upstream.py"), "--port",
                             str(port), "--chunks", "4", "--delay-ms", "500"],  # 2 s a request
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def served() -> float:
        text = httpx.get(f"{url}/metrics", timeout=5).text
        return float(next(x for x in text.splitlines() if x.startswith("mock_served_total")).split()[1])

    out = tmp_path / "report"
    try:
        load = subprocess.Popen([sys.executable, "-m", "stack.entrypoints.cli", "bench", "load", "--scenario",
                                 str(write_scenario(tmp_path, SLOW)), "--url", url + "/v1", "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "COLUMNS": "200"})
        deadline = time.monotonic() + 60
        while True:  # both users' first requests are in flight (none can have finished yet)
            with contextlib.suppress(httpx.HTTPError):
                if served() >= 2:
                    break
            assert load.poll() is None and time.monotonic() < deadline, load.communicate()
            time.sleep(0.1)
        stop_locust(load)
        stdout, stderr = load.communicate(timeout=60)
        sent = served()
    finally:
        mock.terminate()
        mock.wait(timeout=10)
    assert load.returncode == 0, stdout + stderr
    records = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert len(records) == sent >= 2 and all(r["ok"] for r in records)
    assert json.loads((out / "report.json").read_text())["metrics"]["requests"] == sent


KEY = "sk-loadtest-readme-0001"


def readme_command(startswith: str) -> str:
    """The command of loadtests/README.md that starts so (with its continuation lines joined)."""
    text = (REPO / "loadtests" / "README.md").read_text().replace("\\\n", " ")
    found = [line.strip() for line in text.splitlines() if line.strip().startswith(startswith)]
    assert len(found) == 1, f"loadtests/README.md: {len(found)} commands start with {startswith!r}"
    return found[0]


def run_as_written(command: str, gateway: str, cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """The README's command with the gateway's URL for its host, run from the checkout with only the API key
    in the environment beside what the command sets (no VSTACK_* of the test run)."""
    argv = shlex.split(command.replace("http://127.0.0.1:8000", gateway))
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("VSTACK_")}
    while "=" in argv[0]:  # VAR=value prefixes
        name, value = argv.pop(0).split("=", 1)
        env[name] = value
    assert argv[0] == "locust"
    env["VSTACK_API_KEY"] = KEY
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    argv = [*argv, *extra]
    if "--csv" in argv:  # the CSV files go to the test's folder
        argv[argv.index("--csv") + 1] = str(cwd / argv[argv.index("--csv") + 1])
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def gateway(mock_url: str) -> Iterator[str]:
    """The gateway with API keys on, one deployment (the mock) and no engine of ours."""
    from stack.config.sections.gateway import GatewayConfig, KeyRef
    from stack.gateway.app import create_app
    from stack.gateway.registry import Deployment, DeploymentRegistry

    registry = DeploymentRegistry()
    registry.add(Deployment(id="mock-1", model_group="smol", kind="local", upstream_model="mock", api_base=mock_url))
    settings = GatewayConfig(api_keys=[KeyRef(name="load", env="LOAD_KEY")])
    app = create_app(settings, default_model="smol", registry=registry, environ={"LOAD_KEY": KEY})
    with app_in_thread(app) as (url, _loop):
        yield url


def test_the_readmes_headless_command_runs_smoke_through_the_gateway(gateway: str, tmp_path: Path) -> None:
    command = readme_command("VSTACK_SCENARIO=smoke locust -f loadtests/locustfile.py --headless -u 2 -r 2 -t 5s")
    proc = run_as_written(command, gateway, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "scenario smoke (" in out and "SLO met over " in out, out  # the scenario's SLO, checked
    rows = {r["Name"]: r for r in csv.DictReader((tmp_path / "smoke_stats.csv").open()) if r["Type"] == "POST"}
    assert set(rows) == {"chat smol"}  # the first model the gateway lists, reached with the key from the env
    assert int(rows["chat smol"]["Request Count"]) >= 10 and rows["chat smol"]["Failure Count"] == "0"
    ttft = [r for r in csv.DictReader((tmp_path / "smoke_stats.csv").open()) if r["Type"] == "TTFT"]
    assert int(ttft[0]["Request Count"]) >= 10  # every request streamed (the smoke scenario's)


def test_a_missed_slo_from_locusts_own_option_exits_1(gateway: str, tmp_path: Path) -> None:
    command = readme_command("VSTACK_SCENARIO=smoke locust -f loadtests/locustfile.py --headless -u 2 -r 2 -t 5s")
    proc = run_as_written(command.replace("-t 5s", "-t 2s"), gateway, tmp_path, "--slo", "p95_e2e_ms<0.01")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "SLO NOT MET over " in out and "p95_e2e_ms<0.01: " in out and "-> FAIL" in out, out
    rows = [r for r in csv.DictReader((tmp_path / "smoke_stats.csv").open()) if r["Type"] == "POST"]
    assert rows[0]["Failure Count"] == "0"  # the requests succeeded: only the SLO failed the run
