"""SLO clauses: parsing, aliases, checks and how far a miss is."""

from __future__ import annotations

import math

import pytest

from stack.config.slo import Clause, SloError, all_met, distance, evaluate, parse_slo


def test_parse_forms() -> None:
    assert parse_slo("p95_ttft_ms<800") == [Clause("p95_ttft_ms", "<", 800)]
    assert parse_slo("p99_e2el_ms <= 2000, tok_s>=50 and errors<0.01") == [
        Clause("p99_e2e_ms", "<=", 2000), Clause("output_tokens_per_s", ">=", 50), Clause("error_rate", "<", 0.01)]
    assert parse_slo(["rps>1.5"]) == [Clause("requests_per_s", ">", 1.5)]
    assert parse_slo(None) == []


@pytest.mark.parametrize("text, needle", [
    ("p95_ttft<800", "did you mean 'p95_ttft_ms'"),
    ("p95_ttft_ms=800", "does not parse"),
    ("latency<fast", "does not parse"),
])
def test_parse_errors(text: str, needle: str) -> None:
    with pytest.raises(SloError, match=needle):
        parse_slo(text)


def test_evaluate_and_distance() -> None:
    clauses = parse_slo("p95_ttft_ms<800, output_tokens_per_s>=100")
    results = evaluate(clauses, {"p95_ttft_ms": 1000.0, "output_tokens_per_s": 150.0})
    assert [r.met for r in results] == [False, True]
    assert distance(results) == pytest.approx(0.25)
    assert not all_met(results)
    assert "FAIL (off by 25%)" in results[0].describe()
    missing = evaluate(clauses, {"p95_ttft_ms": math.nan})
    assert distance(missing) == math.inf and not any(r.met for r in missing)
