"""The tune rule: the highest throughput within the SLO; else the closest, said so; failures never win."""

from __future__ import annotations

from stack.config.slo import parse_slo
from stack.tune.choose import Measured, choose


def m(key: str, tok_s: float, ttft: float, error: str | None = None) -> Measured:
    metrics = None if error else {"output_tokens_per_s": tok_s, "p95_ttft_ms": ttft}
    return Measured(key, key, {"max_num_seqs": key}, metrics, error)


def test_highest_throughput_among_those_that_meet_the_slo() -> None:
    c = choose([m("a", 100, 500), m("b", 300, 900), m("c", 200, 700)], parse_slo("p95_ttft_ms<800"))
    assert c.winner and c.winner.key == "c" and c.meets_slo
    assert "2 candidates that meet the SLO" in c.reason


def test_none_meets_the_closest_is_reported_as_such() -> None:
    c = choose([m("a", 100, 1600), m("b", 300, 1000), m("c", 200, 1200)], parse_slo("p95_ttft_ms<800"))
    assert c.winner and c.winner.key == "b" and not c.meets_slo
    assert c.reason.startswith("no candidate meets the SLO; closest: b") and "off by 25%" in c.reason


def test_ties_in_shortfall_go_to_throughput() -> None:
    c = choose([m("a", 100, 1000), m("b", 300, 1000)], parse_slo("p95_ttft_ms<800"))
    assert c.winner and c.winner.key == "b"


def test_failed_candidates_never_win() -> None:
    c = choose([m("a", 0, 0, error="rejected: bad option"), m("b", 10, 5000)], parse_slo("p95_ttft_ms<800"))
    assert c.winner and c.winner.key == "b" and not c.meets_slo
    nobody = choose([m("a", 0, 0, error="engine exited")], parse_slo("p95_ttft_ms<800"))
    assert nobody.winner is None and nobody.reason == "no candidate could be measured"


def test_a_capacity_run_that_lost_requests_never_meets_the_slo() -> None:
    # vllm bench serve leaves failed requests out of its percentiles: b's latencies look best, its run lost 3.
    lost = Measured("b", "b", {"k": "b"}, {"output_tokens_per_s": 900, "p95_ttft_ms": 100, "errors": 3, "ok": 97})
    c = choose([m("a", 300, 700), lost], parse_slo("p95_ttft_ms<800"))
    assert c.winner and c.winner.key == "a" and c.meets_slo and "only candidate" in c.reason
    # Nobody meets it: one that lost requests is never the closest while another lost none.
    c = choose([m("a", 300, 1200), lost], parse_slo("p95_ttft_ms<800"))
    assert c.winner and c.winner.key == "a" and not c.meets_slo
    alone = choose([lost], parse_slo("p95_ttft_ms<800"))
    assert alone.winner is lost and not alone.meets_slo and "(3 requests failed)" in alone.reason


def test_a_capacity_run_that_answered_nothing_ends_the_candidate() -> None:
    import pytest

    from stack.tune.measure_candidate import answered
    from stack.tune.rate_search import ProbeFailed

    figures = {"errors": 64, "ok": 0, "p95_ttft_ms": 0.0, "output_tokens_per_s": 0.0}  # what vllm bench reports
    with pytest.raises(ProbeFailed, match="every request of the capacity run failed \\(64\\)"):
        answered(figures)
    assert answered({"errors": 1, "ok": 63}) == {"errors": 1, "ok": 63}


def test_without_slo_the_fastest_wins() -> None:
    c = choose([m("a", 100, 1), m("b", 300, 99999)], [])
    assert c.winner and c.winner.key == "b" and c.meets_slo


def g(key: str, goodput: float, tok_s: float, ttft: float, overrides: dict | None = None,
      answers: list[str] | None = None, numerics: str | None = None) -> Measured:
    metrics = {"goodput_rps": goodput, "output_tokens_per_s": tok_s, "p95_ttft_ms": ttft}
    return Measured(key, key, overrides if overrides is not None else {"k": key}, metrics, None, numerics,
                    answers=answers)


def test_goodput_ranks_by_the_rate_that_held_not_by_throughput() -> None:
    # b serves more tokens at its point but held the SLO at a lower rate; z never held it (goodput 0).
    c = choose([g("a", 28.0, 3000, 700), g("b", 20.0, 3500, 600), g("z", 0.0, 4000, 790)],
               parse_slo("p95_ttft_ms<800"))
    assert c.winner and c.winner.key == "a" and c.meets_slo and "goodput 28.00 req/s" in c.reason
    none = choose([g("z", 0.0, 4000, 900)], parse_slo("p95_ttft_ms<800"))
    assert none.winner and not none.meets_slo


def test_quality_guard_compares_answers_with_the_baseline() -> None:
    from types import SimpleNamespace

    from stack.tune.run import quality_checks

    base = g("base", 20, 1, 1, overrides={}, answers=["a", "b", "c", "d"])
    fp8 = g("fp8", 25, 1, 1, {"quantization": "fp8"}, ["a", "b", "x", "d"], "weights quantization fp8")
    plain = g("seqs", 21, 1, 1, {"max_num_seqs": 8}, ["a", "b", "c", "d"])
    real = SimpleNamespace(engine={})
    checks = quality_checks([base, fp8, plain], real)  # type: ignore[arg-type]
    assert set(checks) == {"fp8"} and checks["fp8"]["exact_match"] == 0.75
    assert "3 of 4 answers identical" in checks["fp8"]["note"]
    dummy = SimpleNamespace(engine={"load_format": "dummy"})
    assert "not possible: dummy weights" in quality_checks([base, fp8], dummy)["fp8"]["note"]  # type: ignore[arg-type]


def test_quality_floor_keeps_a_faster_candidate_that_changed_its_answers_out() -> None:
    """The guard decides: fp8 serves the most but kept 1 of 4 answers, below a 0.5 floor, so the next best is
    chosen and the reason names what was kept out and why; at a floor of 0.25 fp8 wins again."""
    from types import SimpleNamespace

    from stack.tune.run import quality_checks

    base = g("base", 20, 1, 1, overrides={}, answers=["a b", "c d", "e f", "g h"])
    base.answer_tokens = [["a", " b"], ["c", " d"], ["e", " f"], ["g", " h"]]
    fp8 = g("fp8", 30, 1, 1, {"quantization": "fp8"}, ["a b", "c x", "y", "g z"], "weights quantization fp8")
    fp8.answer_tokens = [["a", " b"], ["c", " x"], ["y"], ["g", " z"]]
    kv = g("kv", 25, 1, 1, {"kv_cache_dtype": "fp8"}, ["a b", "c d", "e f", "g z"], "KV cache fp8")
    kv.answer_tokens = [["a", " b"], ["c", " d"], ["e", " f"], ["g", " z"]]
    real = SimpleNamespace(engine={})
    slo = parse_slo("p95_ttft_ms<800")

    checks = quality_checks([base, fp8, kv], real, 0.5)  # type: ignore[arg-type]
    q = checks["fp8"]
    assert q["exact_match"] == 0.25 and q["below"] and q["earliest_divergence"] == 0
    assert [d["token"] for d in q["first_divergence"]] == [1, 0, 1]
    assert q["first_divergence"][0] == {"prompt": q["first_divergence"][0]["prompt"], "token": 1,
                                        "baseline": " d", "candidate": " x"}
    assert checks["kv"]["exact_match"] == 0.75 and not checks["kv"]["below"]
    refused = {k: v["note"] for k, v in checks.items() if v["below"]}
    c = choose([base, fp8, kv], slo, refused)
    assert c.winner and c.winner.key == "kv" and c.meets_slo
    assert "not chosen for their answers: fp8 (goodput 30.00 req/s: 1 of 4 answers identical" in c.reason

    lower = quality_checks([base, fp8, kv], real, 0.25)  # type: ignore[arg-type]
    c = choose([base, fp8, kv], slo, {k: v["note"] for k, v in lower.items() if v["below"]})
    assert c.winner and c.winner.key == "fp8" and "not chosen" not in c.reason


def test_every_candidate_below_the_floor_means_no_winner() -> None:
    c = choose([g("fp8", 30, 1, 1)], parse_slo("p95_ttft_ms<800"), {"fp8": "0 of 8 answers identical"})
    assert c.winner is None and "every measured candidate failed the quality guard" in c.reason
