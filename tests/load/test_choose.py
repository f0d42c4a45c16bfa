"""The tune rule: the highest throughput within the SLO; else the closest, said so; failures never win."""

from __future__ import annotations

from stack.config.slo import parse_slo
from stack.load.choose import Measured, choose


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


def test_without_slo_the_fastest_wins() -> None:
    c = choose([m("a", 100, 1), m("b", 300, 99999)], [])
    assert c.winner and c.winner.key == "b" and c.meets_slo
