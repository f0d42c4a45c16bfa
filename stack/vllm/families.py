"""Model families and how vLLM serves their tool calls and reasoning (adr/0013-model-families-and-adapters.md).

A model config may state `serving:` (tool_call_parser, reasoning_parser, auto_tool_choice, chat_template);
what it leaves unset comes from its family, recognised from config.json (`model_type`, vocabulary size)
and the model's name. The result becomes vLLM options (`--tool-call-parser`, `--enable-auto-tool-choice`,
`--reasoning-parser`, `--chat-template`), each with its origin, checked against the parsers the installed
vLLM registers. vLLM 0.32 constrains named and `required` tool choice with structured outputs (any model
can follow them) but still refuses every tool_choice but "none" without a tool parser
(renderers/online_renderer.py), so every family here names one, the default SmolLM2 included.
"""

from __future__ import annotations

import ast
import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from stack.config.origins import suggest
from stack.config.schema import ModelEntry
from stack.errors import ConfigError


@dataclass(frozen=True)
class Family:
    name: str
    tool_call_parser: str | None
    reasoning_parser: str | None = None
    why: str = ""
    # Small models do not follow argument schemas: pin them for every request with tools
    # (--tool-strict-level parameter, vLLM >= 0.32; otherwise only tools marked `strict: true` are pinned).
    strict_arguments: bool = False


# The serving facts each family's model card documents (vLLM's tool calling guide names the same parsers).
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("qwen2.5", "hermes", None, "Qwen2.5 emits <tool_call> JSON (Hermes format)"),
        Family("qwen3", "hermes", "qwen3", "Qwen3 emits <tool_call> JSON and <think> reasoning"),
        Family("llama3", "llama3_json", None, "Llama 3.1/3.2/3.3 emit JSON tool calls (llama3_json)"),
        Family("mistral", "mistral", None, "Mistral emits [TOOL_CALLS] (mistral)"),
        Family("gpt-oss", "openai", "openai_gptoss", "gpt-oss speaks the Harmony format (openai)"),
        Family("smollm2", "hermes", None, "SmolLM2 was tuned on <tool_call> JSON (Hermes format); 135M rarely "
               "calls on its own (auto); 'required' and named tools are constrained to the schema",
               strict_arguments=True),
    )
}
_MODEL_TYPES = {"qwen2": "qwen2.5", "qwen3": "qwen3", "qwen3_moe": "qwen3", "mistral": "mistral",
                "gpt_oss": "gpt-oss"}  # fmt: skip


def infer_family(config: dict[str, Any], names: list[str]) -> tuple[str | None, str]:
    """(family, why) from config.json and the model's names (hub id, folder, config name)."""
    model_type = str(config.get("model_type", ""))
    text = " ".join(names).lower()
    if model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type], f"config.json model_type {model_type!r}"
    if model_type == "llama":
        if "smollm" in text or config.get("vocab_size") == 49152:
            return "smollm2", "config.json model_type 'llama' with SmolLM2's 49152-token vocabulary"
        if config.get("vocab_size") == 128256 or "llama-3" in text:
            return "llama3", "config.json model_type 'llama' with Llama 3's 128256-token vocabulary"
    if model_type:
        return None, f"no family known for model_type {model_type!r}"
    for needle, family in (("qwen3", "qwen3"), ("qwen2.5", "qwen2.5"), ("llama-3", "llama3"),
                           ("mistral", "mistral"), ("gpt-oss", "gpt-oss"), ("smollm2", "smollm2")):  # fmt: skip
        if needle in text:
            return family, f"the model's name contains {needle!r} (no config.json here)"
    return None, "no config.json and no family in the model's name"


def read_config(model_dir: Path | None) -> dict[str, Any]:
    path = model_dir / "config.json" if model_dir else None
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class Registered:
    """The tool and reasoning parser names the installed vLLM registers (read from its registration tables)."""

    tool_parsers: frozenset[str]
    reasoning_parsers: frozenset[str]


@cache
def registered_parsers(python: str) -> Registered | None:
    """Parsed from vllm/tool_parsers/__init__.py and vllm/reasoning/__init__.py of `python`'s vLLM without
    importing it (that takes ~10 s); None when no vLLM is there or the tables moved."""
    code = "import importlib.util as u; s = u.find_spec('vllm'); print(s.submodule_search_locations[0] if s else '')"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    if not out:
        return None
    tools = _table_keys(Path(out) / "tool_parsers" / "__init__.py", "_TOOL_PARSERS_TO_REGISTER")
    reasoning = _table_keys(Path(out) / "reasoning" / "__init__.py", "_REASONING_PARSERS_TO_REGISTER")
    if not tools or not reasoning:
        return None
    return Registered(frozenset(tools), frozenset(reasoning))


def _table_keys(path: Path, name: str) -> set[str]:
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return set()
    for node in tree.body:
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if isinstance(target, ast.Name) and target.id == name and isinstance(node.value, ast.Dict):
            return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    return set()


def serving_options(model: ModelEntry, model_dir: Path | None, engine: dict[str, Any], where: str,
                    known: Callable[[str], bool] = lambda _: True) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """Engine options for tools, reasoning and chat template the profile has not set: (options, origins,
    notes). `where`: the config file of the model entry, for origins; `known`: is an option in this vLLM."""
    if model.task == "embed":
        return {}, {}, []
    facts = model.serving
    config = read_config(model_dir)
    names = [n for n in (model.name, model.source.hub, model.source.path) if n]
    if facts.family:
        if facts.family not in FAMILIES:
            raise ConfigError(f"models.{model.name}.serving.family: unknown family {facts.family!r}"
                              f"{suggest(facts.family, FAMILIES)} ({where})",
                              hint=f"one of: {', '.join(FAMILIES)}; or set tool_call_parser/reasoning_parser")
        family, why = facts.family, f"models.{model.name}.serving.family"
    else:
        family, why = infer_family(config, names)
    fam = FAMILIES.get(family) if family else None
    options: dict[str, Any] = {}
    origins: dict[str, str] = {}
    notes = [f"family: {family} ({why})" if fam else f"family: unknown ({why}); without serving.tool_call_parser "
             "vLLM refuses every tool_choice but 'none'"]
    if fam:
        notes.append(f"tools: {fam.why}")
    stated = f"{where}: models.{model.name}.serving"
    inferred = f"inferred: family {family} ({why})"

    def put(key: str, value: Any, origin: str) -> None:
        if key not in engine and value is not None:
            options[key], origins[key] = value, origin

    tool = facts.tool_call_parser if facts.tool_call_parser is not None else (fam.tool_call_parser if fam else None)
    tool_origin = stated if facts.tool_call_parser is not None else inferred
    if tool == "none":
        tool = None
    put("tool_call_parser", tool, tool_origin)
    has_parser = bool(tool or engine.get("tool_call_parser"))
    auto = facts.auto_tool_choice if facts.auto_tool_choice is not None else has_parser
    if auto and not has_parser:
        raise ConfigError(f"models.{model.name}.serving.auto_tool_choice: true needs a tool_call_parser ({where})",
                          hint="set serving.tool_call_parser (e.g. hermes), or leave auto_tool_choice unset")
    if auto:
        put("enable_auto_tool_choice", True, stated if facts.auto_tool_choice is not None else tool_origin)
    reasoning = facts.reasoning_parser
    if reasoning is None:
        reasoning = fam.reasoning_parser if fam else None
    if reasoning != "none":
        put("reasoning_parser", reasoning, stated if facts.reasoning_parser is not None else inferred)
    put("chat_template", facts.chat_template, stated)
    if fam and fam.strict_arguments and (tool or engine.get("tool_call_parser")):
        if known("tool_strict_level"):
            put("tool_strict_level", "parameter", f"{inferred}: arguments pinned to each tool's schema")
        else:
            notes.append("tools: this vLLM has no --tool-strict-level; arguments follow the schema for tools "
                         "marked `strict: true`")
    return options, origins, notes


def check_parsers(model: ModelEntry, engine: dict[str, Any], registered: Registered | None, where: str) -> None:
    """Refuse a parser name the installed vLLM does not register (a typo would fail at engine start)."""
    if registered is None or engine.get("tool_parser_plugin") or engine.get("reasoning_parser_plugin"):
        return  # a plugin registers its own names: vLLM checks them when it starts
    for key, known in (("tool_call_parser", registered.tool_parsers),
                       ("reasoning_parser", registered.reasoning_parsers)):  # fmt: skip
        value = engine.get(key)
        if value and value not in known:
            raise ConfigError(f"{key} {value!r} of model {model.name!r} is not a parser the installed vLLM "
                              f"registers{suggest(str(value), known)} ({where})",
                              hint=f"one of: {', '.join(sorted(known))}")
