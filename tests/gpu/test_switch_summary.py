"""The GPU switch bench's summary (bench/switch_gpu.py): what the README's switch figures are computed from.
Round 0 is every side's warm-up (each engine's first sleep pins its host buffers); the medians leave it out."""

from __future__ import annotations

from bench.switch_gpu import summarize

BUS = {"sequential_s": 0.4, "overlapped_s": 0.3}


def switch(side: str, rnd: int, total: float, frm: str = "8b", to: str = "3b") -> dict:
    return {"side": side, "round": rnd, "from": frm, "to": to, "total_s": total, "kind": "sleeping", "bus": BUS}


def test_warm_up_round_is_reported_apart_and_left_out_of_the_medians() -> None:
    result = {"switches": [switch("vstack-handoff", 0, 5.3), switch("raw", 0, 5.7),
                           switch("vstack-handoff", 1, 0.46), switch("raw", 1, 0.97),
                           switch("vstack-handoff", 2, 0.50), switch("raw", 2, 1.01),
                           switch("vstack-handoff", 3, 0.48), switch("raw", 3, 0.99)]}  # fmt: skip
    row = summarize(result)["8b->3b"]
    assert row["vstack-handoff"] == 0.48 and row["raw"] == 0.99 and row["runs"] == 3
    assert row["first_round"] == {"vstack-handoff": 5.3, "raw": 5.7}
    assert row["max"]["vstack-handoff"] == 0.50
    assert row["ratio_best_to_raw"] == round(0.48 / 0.99, 3)
    assert summarize(result)["_checks"]["every_switch_le_half_raw"] is True


def test_a_single_round_is_all_there_is_and_counts() -> None:
    row = summarize({"switches": [switch("vstack-handoff", 0, 0.6), switch("raw", 0, 1.0)]})["8b->3b"]
    assert row["vstack-handoff"] == 0.6 and row["ratio_best_to_raw"] == 0.6


def test_the_overlapped_handoff_is_a_side_of_its_own_and_the_best_of_ours_counts() -> None:
    result = {"switches": [switch("vstack-handoff", 0, 5.3), switch("vstack-handoff-overlap", 0, 0.7),
                           switch("raw", 0, 5.7), switch("vstack-handoff", 1, 0.62),
                           switch("vstack-handoff-overlap", 1, 0.47), switch("raw", 1, 0.96)]}  # fmt: skip
    row = summarize(result)["8b->3b"]
    assert row["vstack-handoff"] == 0.62 and row["vstack-handoff-overlap"] == 0.47
    assert row["best_vstack"] == 0.47 and row["ratio_best_to_raw"] == round(0.47 / 0.96, 3)


def test_each_side_has_its_spread_and_its_ratio_to_the_overlapped_bus() -> None:
    rounds = [0.52, 0.46, 0.50, 0.48, 0.61]
    result = {"switches": [switch("vstack-handoff-overlap", 0, 4.0), switch("raw", 0, 5.0)]
              + [switch("vstack-handoff-overlap", i + 1, t) for i, t in enumerate(rounds)]
              + [switch("raw", i + 1, 1.0) for i in range(5)]}  # fmt: skip
    row = summarize(result)["8b->3b"]
    assert row["vstack-handoff-overlap"] == 0.50  # the median of the five steady rounds
    assert row["spread"]["vstack-handoff-overlap"] == {"min": 0.46, "max": 0.61, "n": 5, "p25": 0.47, "p75": 0.565}
    assert row["ratio_to_overlapped_bus"] == {"vstack-handoff-overlap": round(0.50 / 0.3, 3),
                                              "raw": round(1.0 / 0.3, 3)}
