"""The gate's rules on recorded sides (no engine): each failing kind named, warnings that never gate."""

from __future__ import annotations

from stack.upgrade.answers import Answer, answer_of, compare_answers
from stack.upgrade.verdict import judge

PINNED = {"started": True, "startup_s": 40.0, "goodput_rps": 2.0, "kv_tokens_vllm": 10000,
          "kv_tokens_planner": 10100, "error": None}


def side(**kw: object) -> dict:
    return {**PINNED, **kw}


def same_answers(n: int = 3) -> dict:
    a = [Answer(f"p{i}", "chat", "Paris.", ["Paris", "."]) for i in range(n)]
    return compare_answers(a, a)


def test_a_candidate_as_good_as_the_pinned_passes() -> None:
    v = judge(PINNED, side(goodput_rps=1.9), same_answers(), None, {"patches": []})
    assert v.passed and not v.reasons


def test_each_failure_is_named_by_its_kind() -> None:
    slow = judge(PINNED, side(goodput_rps=1.0), same_answers(), None, None)
    assert [r.kind for r in slow.reasons] == ["goodput"] and "-50%" in slow.reasons[0].text
    never = judge(PINNED, side(goodput_rps=0.0, goodput_note="the SLO fails even at 0.25 req/s"), same_answers(),
                  None, None)
    assert [r.kind for r in never.reasons] == ["slo"]
    dead = judge(PINNED, side(started=False, error="exit 1"), None, None, None)
    assert [r.kind for r in dead.reasons] == ["start"] and not dead.passed
    refused = judge(PINNED, side(started=False, error="not started"), None, "unrecognized arguments: --x", None)
    assert refused.reasons[0].kind == "options"
    broke = judge(PINNED, side(), same_answers(), None, {"patches": [
        {"id": "p", "state": "conflict", "detail": "hunk 1 failed", "blocks": True}]})
    assert [r.kind for r in broke.reasons] == ["patches"]


def test_different_answers_name_the_first_diverging_token() -> None:
    pinned = [Answer("chat-capital", "chat", "The capital is Paris.", ["The", " capital", " is", " Paris", "."])]
    cand = [Answer("chat-capital", "chat", "The capital is Lyon.", ["The", " capital", " is", " Lyon", "."])]
    compared = compare_answers(pinned, cand)
    assert compared["match_rate"] == 0 and compared["differences"][0]["token"] == 3
    v = judge(PINNED, side(), compared, None, None)
    assert v.reasons[0].kind == "answers" and "chat-capital at token 3 (' Paris' -> ' Lyon')" in v.reasons[0].text
    assert judge(PINNED, side(), compared, None, None, min_match=0.0).passed


def test_start_time_and_kv_changes_warn_only() -> None:
    v = judge(PINNED, side(startup_s=90.0, kv_tokens_vllm=8000), same_answers(), None, None)
    assert v.passed and len(v.warnings) == 2


def test_a_tool_call_is_compared_as_its_name_and_arguments() -> None:
    reply = {"choices": [{"message": {"content": None, "tool_calls": [
        {"function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        "logprobs": {"content": [{"token": "{"}, {"token": "\""}]}}]}
    assert answer_of(reply) == ('get_weather({"city": "Paris", "unit": "celsius"})', ["{", "\""])


def test_the_check_searches_with_the_scenario_settings_and_the_request_overrides(tmp_path) -> None:
    """The upgrade scenario's search settings, with the CLI's --max-probes/--min-requests/--probe-s/--repeats on top."""
    from stack.load.scenario import load_scenario
    from stack.upgrade.check import CheckRequest, search_settings

    scenario = load_scenario("upgrade")
    req = CheckRequest(version="0.32.0", profiles=[None], out_dir=tmp_path, max_probes=2, probe_s=3.0)
    s = search_settings(scenario, req)
    assert (s.max_probes, s.probe_s) == (2, 3.0)
    assert (s.min_requests, s.repeats) == (scenario.tune.min_requests, scenario.tune.repeats)
