"""The prefix-switch row's verdict (bench/gpu/prefix_switch.py): what it counts as met, from cycles as the GPU
run writes them (the run itself needs the lent GPU)."""

from __future__ import annotations

from bench.gpu.prefix_switch import prefix, summary


def cycles(return_s: float, switch_s: float) -> dict:
    row = {"a_return_s": return_s, "a_warm_s": 0.05, "switch_to_a": {"seconds": switch_s},
           "switch_to_b": {"seconds": switch_s}}  # fmt: skip
    return {"cycles": [row, row, row]}


def test_met_when_the_return_is_five_times_faster_and_the_switch_no_more_than_ten_percent_slower() -> None:
    met = summary(cycles(0.10, 0.66), cycles(0.80, 0.62))
    assert met["ttft_gain_x"] == 8.0 and met["switch_ratio_x"] == 1.065 and met["goals_met"]
    assert not summary(cycles(0.20, 0.66), cycles(0.80, 0.62))["goals_met"]  # 4x
    assert not summary(cycles(0.10, 0.70), cycles(0.80, 0.62))["goals_met"]  # switch 1.13x
    assert not summary({"cycles": []}, cycles(0.80, 0.62))["goals_met"]  # a side that did not run


def test_the_prefix_is_one_dummy_token_per_word() -> None:
    words = prefix(8192).split()
    assert len(words) == 8192 == len(set(words)) and words[0] == "t1000"


def test_each_model_gets_a_context_its_checkpoint_allows_and_the_tier_holds_the_prefix() -> None:
    """A 32k session (the 8k one is floor-bound on an H100: 2.3x at most): A's context holds it, B's stays within
    its checkpoint's (a 33k max_model_len on Qwen2.5-7B is refused by the planner), and A's CPU tier holds
    the whole prompt (the 4 GiB default holds exactly 32k tokens of the 8B shape)."""
    from bench.gpu.prefix_switch import KV_BYTES_A, MODEL_A, MODEL_B, model_engines
    from bench.gpu.profiles import fixture_config, fixture_for
    from stack.config import load_config
    from stack.vllm.kv_offload import DEFAULT_GIB, SIZE_KEY

    cfg = load_config()
    shape = {m: fixture_config(fixture_for(cfg.models[m].source.hub)) for m in (MODEL_A, MODEL_B)}
    a = shape[MODEL_A]
    head = a["hidden_size"] // a["num_attention_heads"]
    assert a["num_hidden_layers"] * a["num_key_value_heads"] * head * 2 * 2 == KV_BYTES_A  # K and V, bf16
    for tokens in (8192, 32768):
        kept, off = model_engines(tokens, True), model_engines(tokens, False)
        assert kept[MODEL_A]["max_model_len"] == tokens + 1024 <= shape[MODEL_A]["max_position_embeddings"]
        assert kept[MODEL_B]["max_model_len"] <= shape[MODEL_B]["max_position_embeddings"]
        tier = kept[MODEL_A][SIZE_KEY]
        assert tier * 2**30 >= (tokens + 1024) * KV_BYTES_A and tier >= DEFAULT_GIB
        assert SIZE_KEY not in off[MODEL_A] and SIZE_KEY not in kept[MODEL_B]  # the other side: today's switch
    assert model_engines(8192, True)[MODEL_A][SIZE_KEY] == DEFAULT_GIB  # the 8k run's tier, as on 2026-11-27


def test_sides_measured_in_separate_calls_merge_into_one_verdict_and_mismatched_setups_are_refused(tmp_path) -> None:
    """With CUDA graphs each side takes a device call of its own (every engine compiles at its first start)."""
    import json

    import pytest

    from bench.gpu.prefix_switch import main

    setup = {"device": "NVIDIA H200", "prefix_tokens": 8192, "cuda_graphs": True, "models": ["a", "b"]}
    keep, off = tmp_path / "keep.json", tmp_path / "off.json"
    keep.write_text(json.dumps({**setup, "keep": cycles(0.05, 0.66)}))
    off.write_text(json.dumps({**setup, "off": cycles(0.30, 0.62)}))
    out = tmp_path / "merged.json"
    assert main(["--merge", str(keep), str(off), "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert merged["summary"]["ttft_gain_x"] == 6.0 and merged["cuda_graphs"] is True
    eager = tmp_path / "eager.json"
    eager.write_text(json.dumps({**setup, "cuda_graphs": False, "off": cycles(0.30, 0.62)}))
    with pytest.raises(SystemExit, match="cuda_graphs False differs"):
        main(["--merge", str(keep), str(eager), "--out", str(out)])
    with pytest.raises(SystemExit, match="no off side"):
        main(["--merge", str(keep), "--out", str(out)])
