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
