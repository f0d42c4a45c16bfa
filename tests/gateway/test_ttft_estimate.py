"""The TTFT estimate and the spill decision (stack.gateway.routing.ttft_estimate): pure, with plain values."""

from __future__ import annotations

import random

import pytest

from stack.config.slo import parse_clause, parse_slo
from stack.gateway.routing.ttft_estimate import (
    EngineLoad,
    Line,
    TtftFit,
    decide,
    engine_seconds_per_token,
    estimate,
    prompt_chars,
    ttft_limit,
)

LIMIT = parse_clause("p95_ttft_ms<800")


def test_the_fit_recovers_an_engines_line_from_noisy_requests() -> None:
    rng = random.Random(7)
    fit = TtftFit(half_life=500, min_points=8)
    for _ in range(300):
        tokens = rng.randint(50, 4000)
        fit.observe(tokens, 0.05 + tokens / 8000 * rng.uniform(0.9, 1.1))
    line = fit.line()
    assert line is not None
    assert line.tokens_per_s == pytest.approx(8000, rel=0.05)
    assert line.fixed_s == pytest.approx(0.05, abs=0.02)


def test_no_line_before_min_points_and_the_mean_ratio_without_spread() -> None:
    fit = TtftFit(min_points=4)
    for _ in range(3):
        fit.observe(1000, 0.5)
    assert fit.line() is None
    fit.observe(1000, 0.5)
    line = fit.line()
    assert line is not None and line.fixed_s == 0 and line.s_per_token == pytest.approx(0.0005)


def test_the_fit_follows_an_engine_that_slows_down() -> None:
    fit = TtftFit(half_life=20, min_points=8)
    rng = random.Random(1)
    for _ in range(200):
        t = rng.randint(100, 2000)
        fit.observe(t, t / 10000)
    for _ in range(100):  # now twice as slow (a second model beside it, decode traffic)
        t = rng.randint(100, 2000)
        fit.observe(t, t / 5000)
    assert fit.line().tokens_per_s == pytest.approx(5000, rel=0.1)


def test_nonsense_points_are_ignored() -> None:
    fit = TtftFit(min_points=1)
    fit.observe(0, 1.0)
    fit.observe(100, -1.0)
    fit.observe(100, float("nan"))
    assert fit.line() is None


def test_engine_seconds_per_token_from_its_histogram_sums() -> None:
    before = {"vllm:request_prefill_time_seconds_sum": 1.0, "vllm:request_prefill_kv_computed_tokens_sum": 1000}
    after = {"vllm:request_prefill_time_seconds_sum": 3.0, "vllm:request_prefill_kv_computed_tokens_sum": 5000}
    assert engine_seconds_per_token(before, after) == pytest.approx(2 / 4000)
    assert engine_seconds_per_token(after, after) is None  # no request finished in between
    older = {"vllm:request_prefill_time_seconds_sum": 2.0, "vllm:prompt_tokens_total": 1000.0}
    assert engine_seconds_per_token({}, older) == pytest.approx(0.002)  # a vLLM without the computed-tokens one
    assert engine_seconds_per_token({}, {"vllm:num_requests_running": 1.0}) is None


def test_the_estimate_adds_the_prompts_ahead_its_own_and_the_switch() -> None:
    line = Line(0.05, 1 / 10000, "test")
    est = estimate(EngineLoad(3, 6000), own_tokens=2000, line=line, switch_s=0.4)
    assert est is not None
    assert est.seconds == pytest.approx(0.4 + 0.6 + 0.05 + 0.2)
    assert (est.queue_s, est.switch_s) == (pytest.approx(0.6), 0.4)
    assert "3 ahead" in est.describe() and "switch 0.40 s" in est.describe()
    assert estimate(EngineLoad(0, 0), 10, None) is None


def test_requests_waiting_in_the_engine_that_the_gateway_did_not_send_count_too() -> None:
    line = Line(0.0, 1 / 1000, "test")
    seen = EngineLoad(1, 500, running=4, waiting=3, mean_prompt_tokens=400)
    est = estimate(seen, 100, line)
    assert est.requests_ahead == 3 and est.tokens_ahead == 500 + 2 * 400
    assert estimate(EngineLoad(5, 500, waiting=3), 100, line).tokens_ahead == 500  # all of them are ours


@pytest.mark.parametrize(("seconds", "fallback", "spill", "reason"), [
    (0.5, True, False, "within_slo"),
    (0.72, True, False, "within_slo"),  # exactly headroom x limit: kept
    (0.75, True, True, "over_slo"),
    (5.0, False, False, "no_fallback"),
])  # fmt: skip
def test_spill_only_past_headroom_and_only_with_a_fallback(seconds, fallback, spill, reason) -> None:
    line = Line(0.0, 1e-3, "test")
    est = estimate(EngineLoad(0, 0), round(seconds * 1000), line)
    verdict = decide(est, LIMIT, headroom=0.9, has_fallback=fallback)
    assert (verdict.spill, verdict.reason) == (spill, reason)
    assert "p95_ttft_ms<800" in verdict.why


def test_no_estimate_means_served_locally() -> None:
    verdict = decide(None, LIMIT, headroom=0.9, has_fallback=True)
    assert (verdict.spill, verdict.reason) == (False, "no_estimate")


def test_the_spill_keeps_the_tightest_ttft_bound_of_the_slo() -> None:
    assert str(ttft_limit(parse_slo("p99_ttft_ms<2000, p95_ttft_ms<800, p95_itl_ms<50"))) == "p95_ttft_ms<800"
    assert ttft_limit(parse_slo("output_tokens_per_s>=50, p95_e2e_ms<9000")) is None
    assert ttft_limit(parse_slo("p50_ttft_ms>10")) is None  # a lower bound keeps nothing from spilling


def test_prompt_characters_of_every_api_shape() -> None:
    image = {"type": "image_url", "image_url": {"url": "x" * 999}}
    chat = {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "hello"}, image]}]}  # fmt: skip
    assert prompt_chars(chat) == len("be brief") + len("hello")
    assert prompt_chars({"prompt": "abc"}) == 3 and prompt_chars({"prompt": ["ab", "cd"]}) == 4
    assert prompt_chars({"input": "four", "instructions": "xx"}) == 6  # Responses
    assert prompt_chars({"system": "s", "messages": [{"role": "user", "content": "hi"}]}) == 3  # Anthropic
