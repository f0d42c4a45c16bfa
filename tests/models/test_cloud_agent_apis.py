"""Tools, the Responses API and the Anthropic Messages API through the gateway to a cloud deployment
(LiteLLM), and the same tool calls through the local fast path, with the official clients.

The cloud provider is the one thing faked: bench/harness/mock_upstream.py stands in for it (extended for this
issue to call tools, stream tool-call deltas, answer tool results and serve /v1/responses). The gateway,
LiteLLM and the clients are real. The real-engine versions of these checks are in test_served_e2e.py.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from stack.config.sections.gateway import GatewayConfig
from stack.gateway.registry import Deployment
from tests.gateway.conftest import cloud_entry, local, run_gateway, start_mock, stop

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}}}  # fmt: skip
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(autouse=True)
def _cloud_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VSTACK_TEST_CLOUD_KEY", "sk-test-cloud-key-123456")  # read by the gateway per call


@pytest.fixture(scope="module")
def mocks(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("mocks")
    cloud, engine = start_mock(tmp, "cloud-small", "--chunks", "6"), start_mock(tmp, "engine", "--chunks", "6")
    yield cloud, engine
    stop(cloud.proc)
    stop(engine.proc)


@pytest.fixture(scope="module")
def gw(mocks):
    cloud, engine = mocks
    fast = local("fast", engine.url, "local-model")
    embed = Deployment(id="embedder", model_group="embedder", kind="local", upstream_model="embedder",
                       api_base=engine.url, labels={"task": "embed"})  # fmt: skip
    chat = Deployment(id="chatter", model_group="chatter", kind="local", upstream_model="chatter",
                      api_base=engine.url, labels={"task": "generate"})  # fmt: skip
    with run_gateway(GatewayConfig(cloud=[cloud_entry(cloud.url)]), default_model="local-model",
                     deployments=[fast, embed, chat], environ={}) as g:  # fmt: skip
        yield g


@pytest.fixture(scope="module")
def client(gw) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="none", max_retries=0, timeout=60)


@pytest.mark.parametrize("model", ["cloud-small", "local-model"])
def test_named_required_parallel_and_none(client: openai.OpenAI, model: str) -> None:
    named = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME],
                                           tool_choice={"type": "function", "function": {"name": "get_time"}})
    [call] = named.choices[0].message.tool_calls
    assert call.function.name == "get_time" and json.loads(call.function.arguments) == {"city": "Paris"}
    parallel = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME],
                                              tool_choice="required", parallel_tool_calls=True)
    assert [c.function.name for c in parallel.choices[0].message.tool_calls] == ["get_weather", "get_time"]
    assert json.loads(parallel.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris",
                                                                                         "unit": "celsius"}
    single = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice="auto",
                                            parallel_tool_calls=False)
    assert len(single.choices[0].message.tool_calls) == 1 and single.choices[0].finish_reason == "tool_calls"
    none = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="none")
    assert not none.choices[0].message.tool_calls


@pytest.mark.parametrize("model", ["cloud-small", "local-model"])
def test_streamed_tool_call_deltas(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                            stream=True)  # fmt: skip
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for tc in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            entry["name"] += (tc.function.name or "") if tc.function else ""
            entry["arguments"] += (tc.function.arguments or "") if tc.function else ""
    assert [c["name"] for c in calls.values()] == ["get_weather", "get_time"]
    assert json.loads(calls[1]["arguments"]) == {"city": "Paris"} and finish == "tool_calls"


@pytest.mark.parametrize("model", ["cloud-small", "local-model"])
def test_tool_result_round_trip(client: openai.OpenAI, model: str) -> None:
    first = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    messages = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "21C sunny"}]
    reply = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER])
    assert reply.choices[0].message.content == "tool said: 21C sunny"


def test_responses_through_litellm(client: openai.OpenAI) -> None:
    # LiteLLM raises max_output_tokens to OpenAI's minimum (16); the stand-in answers at most 6 words.
    reply = client.responses.create(model="cloud-small", input="hi", max_output_tokens=16)
    assert reply.output_text == "tok " * 6 and reply.usage.output_tokens == 6
    events = list(client.responses.create(model="cloud-small", input="hi", max_output_tokens=16, stream=True))
    assert [e.type for e in events][-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "tok " * 6


def test_anthropic_messages_through_litellm(gw) -> None:
    claude = anthropic.Anthropic(base_url=gw.url, api_key="none", max_retries=0, timeout=60)
    # LiteLLM reaches an `openai/` provider through its Responses API (the stand-in's /v1/responses).
    ask = [{"role": "user", "content": "hi"}]
    reply = claude.messages.create(model="cloud-small", max_tokens=16, messages=ask)
    assert reply.content[0].text.split() == ["tok"] * 6 and reply.usage.output_tokens == 6
    with claude.messages.stream(model="cloud-small", max_tokens=16, messages=ask) as stream:
        assert "".join(stream.text_stream).split() == ["tok"] * 6
        assert stream.get_final_message().stop_reason in ("end_turn", "max_tokens")


def test_tokenize_on_a_cloud_model_is_an_openai_400(gw) -> None:
    resp = httpx.post(f"{gw.url}/tokenize", json={"model": "cloud-small", "prompt": "hi"})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "unsupported_endpoint"


def test_task_mismatch_answers_before_the_engine(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="embedder", messages=ASK)
    assert info.value.code == "model_task_mismatch" and "task: embed" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="chatter", input="x")
    assert "task: generate" in info.value.body["message"]
    assert len(client.embeddings.create(model="embedder", input=["a", "b"]).data) == 2


def test_framework_defaults_become_openai_errors(gw) -> None:
    # The mock, like vLLM for a route it does not mount, answers a bare 404: the client sees OpenAI's shape.
    resp = httpx.post(f"{gw.url}/v1/messages/count_tokens", json={"model": "local-model", "messages": []})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "unsupported_endpoint"
    for method, path in (("POST", "/v1/audio/speech"), ("GET", "/v1/chat/completions"), ("DELETE", "/v1/x")):
        resp = httpx.request(method, f"{gw.url}{path}")
        assert resp.status_code in (404, 405) and set(resp.json()["error"]) == {"message", "type", "param", "code"}


def test_lone_surrogates_are_a_400_not_a_500(gw) -> None:
    # Found by schemathesis (tests/gateway/test_openapi_fuzz.py): valid JSON, but no UTF-8 body can carry it.
    chat = b'{"model": "local-model", "messages": [{"role": "user", "content": "\\ud800"}]}'
    loose = b'{"model": "local-model", "input": "x", "k\\udb31": 1}'
    for path, body in (("/v1/chat/completions", chat), ("/detokenize", loose), ("/v1/responses", loose)):
        resp = httpx.post(f"{gw.url}{path}", content=body, headers={"Content-Type": "application/json"})
        assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error", (path, resp.text)
