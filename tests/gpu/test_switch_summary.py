"""The GPU switch bench's summary (bench/switch_gpu.py): what the README's switch figures are computed from.
Round 0 is every side's warm-up (each engine's first sleep pins its host buffers); the medians leave it out."""

from __future__ import annotations

import json
from pathlib import Path

from bench.harness.switch_summary import table
from bench.switch_gpu import bus_limit, summarize

ROOT = Path(__file__).resolve().parents[2]

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
    assert row["ratio_to_overlapped_bus"] == {
        "vstack-handoff-overlap": round(0.50 / 0.3, 3),
        "raw": round(1.0 / 0.3, 3),
    }


RECORDED = ROOT / "bench/results/2026-11-28-h200-switch-pair-medians/switch_time_gpu_pair-handoff-overlap-raw.json"


def test_a_recorded_h200_run_gives_the_medians_and_ratios_its_manifest_cites() -> None:
    result = json.loads(RECORDED.read_text())
    summary = summarize(result)
    up, down = summary["llama-3b->llama-8b"], summary["llama-8b->llama-3b"]
    assert (up["vstack-handoff-overlap"], up["raw"]) == (0.554, 1.03)
    assert (down["vstack-handoff-overlap"], down["raw"]) == (0.446, 1.022)
    assert up["spread"]["vstack-handoff-overlap"] == {"min": 0.534, "max": 0.575, "n": 4, "p25": 0.535, "p75": 0.574}
    assert down["ratio_best_to_raw"] == 0.436 and down["ratio_to_overlapped_bus"]["vstack-handoff-overlap"] == 1.343
    first = summary["_first_switch_after_start"]["vstack-handoff-overlap"]
    assert (first["switch"], first["total_s"], first["ratio_to_steady"]) == ("llama-3b->llama-8b", 0.786, 1.419)


def test_the_printed_table_shows_median_spread_both_ratios_and_the_first_switch() -> None:
    text = table(json.loads(RECORDED.read_text()))
    lines = text.splitlines()
    assert lines[0].split() == ["switch", "side", "median", "s", "min-max", "s", "(n)", "p25-p75", "s", "x", "raw",
                                "x", "bus", "first", "x", "steady"]  # fmt: skip
    row = next(line.split() for line in lines if line.startswith("llama-3b->llama-8b  vstack-handoff-overlap"))
    assert row[2:] == ["0.554", "0.534-0.575", "(4)", "0.535-0.574", "0.54x", "1.67x", "1.42x"]
    raw = next(line.split() for line in lines if line.startswith("llama-8b->llama-3b  raw"))
    assert raw[2:] == ["1.022", "1.014-1.051", "(4)", "1.015-1.044", "-", "3.08x"]
    assert "both at once 48.38 GB/s each" in text
    assert "llama-3b->llama-8b 0.786 s = 1.42x its steady median 0.554 s" in text


def test_a_run_recorded_before_the_spread_existed_still_prints_its_table() -> None:
    old = ROOT / "bench/results/2026-11-27-h200-switch-pair-first-switch/switch_time_gpu_pair-handoff-raw.json"
    row = next(line.split() for line in table(json.loads(old.read_text())).splitlines()
               if line.startswith("llama-3b->llama-8b  vstack-handoff "))  # fmt: skip
    assert row[2:] == ["0.630", "0.619-0.641", "(2)", "-", "0.65x", "1.98x", "1.16x"]


def test_the_bus_limit_gives_the_incoming_weights_alone_beside_both_ways() -> None:
    bus = {"h2d_gbps": 50.0, "d2h_gbps": 40.0, "duplex_each_gbps": 25.0}
    assert bus_limit(10 * 10**9, 5 * 10**9, bus) == {"sequential_s": 0.35, "overlapped_s": 0.4, "in_only_s": 0.1}


def test_the_warm_side_is_one_of_ours_with_its_own_first_switch() -> None:
    result = {"switches": [switch("vstack-handoff-warm", 0, 0.55), switch("raw", 0, 5.0),
                           switch("vstack-handoff-warm", 1, 0.50), switch("raw", 1, 1.0)]}  # fmt: skip
    summary = summarize(result)
    assert summary["8b->3b"]["best_vstack"] == 0.50 and summary["8b->3b"]["ratio_best_to_raw"] == 0.5
    assert summary["_first_switch_after_start"]["vstack-handoff-warm"]["ratio_to_steady"] == 1.1
    assert "8b->3b  vstack-handoff-warm  0.500" in table({"switches": result["switches"], "bus": {}})


def test_the_first_token_after_a_switch_is_printed_beside_the_same_request_sent_again() -> None:
    result = {"switches": [
        {**switch("raw", 0, 1.0), "first_token_s": 0.5, "first_token_again_s": 0.01},  # warm-up round: left out
        {**switch("raw", 1, 1.0), "first_token_s": 0.08, "first_token_again_s": 0.015},
        {**switch("raw", 2, 1.0), "first_token_s": 0.06, "first_token_again_s": 0.013},
        {**switch("vstack-handoff-warm", 1, 0.4), "first_token_after_switch_s": 0.07, "first_token_again_s": 0.02},
        switch("vstack-handoff-overlap", 1, 0.4),  # recorded before the measure existed: no line
    ]}  # fmt: skip
    lines = [line for line in table(result).splitlines() if line.startswith("first token after the switch")]
    assert lines == ["first token after the switch, raw: median 0.070 s; the same request again at once 0.014 s (n 2)",
                     "first token after the switch, vstack-handoff-warm: median 0.070 s; the same request again at "
                     "once 0.020 s (n 1)"]  # fmt: skip


def test_one_side_per_call_merges_into_one_table_with_both_ratios(tmp_path: Path, capsys) -> None:
    """CUDA-graph engines compile at each start, so the default side and raw vLLM run in two device calls; the
    summary's CLI takes both files and gives the ratio to raw that neither has alone."""
    from bench.harness.switch_summary import main

    ours = {"scenario": "pair", "cuda_graphs": True, "sides": ["handoff-warm"], "bus": {}, "starts": [],
            "switches": [switch("vstack-handoff-warm", r, t) for r, t in enumerate([0.5, 0.32, 0.31, 0.33])]}
    raw = {"scenario": "pair", "cuda_graphs": True, "sides": ["raw"], "bus": {}, "starts": [],
           "switches": [switch("raw", r, t) for r, t in enumerate([7.0, 1.0, 0.98, 1.02])]}  # fmt: skip
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(ours))
    b.write_text(json.dumps(raw))
    assert main([str(a), str(b)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "vstack-handoff-warm" in x and "8b->3b" in x)
    assert "0.320" in line and "0.32x" in line  # 0.32 / 1.00: the median over raw's median, from the other file
    kept = tmp_path / "a-b.json"
    assert main([str(a), str(b), "--out", str(kept)]) == 0
    run = json.loads(kept.read_text())
    assert run["merged_from"] == ["a.json", "b.json"] and len(run["switches"]) == 8
    assert run["summary"]["8b->3b"]["ratio_best_to_raw"] == 0.32


def test_a_missing_result_file_is_named(tmp_path: Path, capsys) -> None:
    from bench.harness.switch_summary import main

    assert main([str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err
    assert "no such result file" in err and "nope.json" in err


def test_runs_of_different_settings_are_not_merged(tmp_path: Path, capsys) -> None:
    from bench.harness.switch_summary import main

    eager = {"scenario": "pair", "cuda_graphs": False, "switches": [switch("raw", 0, 1.0)]}
    graphs = {"scenario": "pair", "cuda_graphs": True, "switches": [switch("vstack-handoff-warm", 0, 0.3)]}
    paths = []
    for name, run in (("e.json", eager), ("g.json", graphs)):
        (tmp_path / name).write_text(json.dumps(run))
        paths.append(str(tmp_path / name))
    assert main(paths) == 2
    assert "differ in 'cuda_graphs'" in capsys.readouterr().err
