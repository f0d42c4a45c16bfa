"""What the installed vLLM itself says about its serve options, read from its source without importing it.

Importing vllm costs ~8 s and the configuration loads before anything else, so the facts a configuration is
checked against at load are taken from the installed vLLM's files: the bounds and defaults its config classes
declare (`gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1)` in `vllm/config/cache.py`), the
options its parser reads as sizes (`human_readable_int_args` in `vllm/engine/arg_utils.py`) and those size
parsers themselves. vLLM enforces the same bounds when it builds its config (at engine start); reading them
here refuses a bad value at load, named by file and key, before anything is planned. The engine's own catalogue
(stack.vllm.options, read from the engine's Python) is read later, by the planner; the two are the same vLLM
where the CLI and the engine share a Python, as every install of this stack does.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

_PARSER_FILES = ("utils/argparse_utils.py", "utils/__init__.py")  # 0.32/0.33, then older versions
_BOUNDS = ("gt", "ge", "lt", "le")
_BOUNDED = re.compile(r"Field\([^)]*\b(?:gt|ge|lt|le)=")


@dataclass(frozen=True)
class FieldRule:
    """One field of a vLLM config class: its kind (`int`, `number`, or None when neither), bounds, default."""

    kind: str | None
    bounds: dict[str, float]
    default: Any = None


@cache
def vllm_root() -> Path | None:
    """The installed vLLM's package folder (located, not imported); None without a vLLM in this Python."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def _tree(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None


@cache
def human_int_parsers() -> tuple[Callable[[str], int], Callable[[str], int]] | None:
    """vLLM's own (human_readable_int, human_readable_int_or_auto), compiled from its source: they need only `re`
    and `argparse`. None without a vLLM here."""
    root = vllm_root()
    for rel in _PARSER_FILES if root is not None else ():
        tree = _tree(root / rel)
        wanted = [node for node in (tree.body if tree else []) if isinstance(node, ast.FunctionDef)
                  and node.name in ("human_readable_int", "human_readable_int_or_auto")]  # fmt: skip
        if len(wanted) == 2:
            namespace: dict[str, Any] = {"re": re, "argparse": argparse}
            exec(compile(ast.Module(body=wanted, type_ignores=[]), str(root / rel), "exec"), namespace)
            return namespace["human_readable_int"], namespace["human_readable_int_or_auto"]
    return None


@cache
def size_options() -> dict[str, bool]:
    """The options vLLM's parser reads as sizes (`32k`), each with whether it also takes `auto` (-1): the names
    `vllm/engine/arg_utils.py` gives human_readable_int (`human_readable_int_args`) and human_readable_int_or_auto
    (`if name == "max_model_len"`). Empty without a vLLM here."""
    root = vllm_root()
    tree = _tree(root / "engine" / "arg_utils.py") if root is not None else None
    found: dict[str, bool] = {}
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "human_readable_int_args"
                                                for t in node.targets):  # fmt: skip
            found.update(dict.fromkeys(_constants(node.value), False))
        elif isinstance(node, ast.If) and "human_readable_int_or_auto" in ast.unparse(node.body):
            found.update(dict.fromkeys(_compared_names(node.test), True))
    return found


def _constants(node: ast.expr) -> list[str]:
    elements = node.elts if isinstance(node, ast.Set | ast.List | ast.Tuple) else []
    return [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _compared_names(test: ast.expr) -> list[str]:
    """`name == "max_model_len"` -> ["max_model_len"]."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        return [c.value for c in test.comparators if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return []


@cache
def field_rules() -> dict[str, FieldRule]:
    """Each serve option whose vLLM config class declares bounds, by its name (the parser's dest): the class is
    the one `EngineArgs` takes the option's default from (`max_model_len = ModelConfig.max_model_len`), else the
    one config class that has the field (a name in two classes with no EngineArgs link is left out). Empty
    without a vLLM here."""
    root = vllm_root()
    if root is None:
        return {}
    classes: dict[str, dict[str, FieldRule]] = {}
    for path in sorted((root / "config").glob("*.py")):
        tree = _tree(path) if _BOUNDED.search(path.read_text(encoding="utf-8")) else None  # parse only those
        for node in tree.body if tree is not None else []:
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, {}).update(dict(_bounded_fields(node)))
    owner = _engine_args_owners(root)
    rules: dict[str, FieldRule] = {}
    for name in {field for fields in classes.values() for field in fields}:
        having = [cls for cls, fields in classes.items() if name in fields]
        chosen = owner.get(name) if owner.get(name) in having else (having[0] if len(having) == 1 else None)
        if chosen is not None:
            rules[name] = classes[chosen][name]
    return rules


def _bounded_fields(cls: ast.ClassDef) -> Iterator[tuple[str, FieldRule]]:
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(stmt.value, ast.Call) and ast.unparse(stmt.value.func).endswith("Field")):  # fmt: skip
            continue
        keywords = {k.arg: _literal(k.value) for k in stmt.value.keywords if k.arg}
        bounds = {k: v for k in _BOUNDS if isinstance(v := keywords.get(k), int | float) and not isinstance(v, bool)}
        if bounds:
            yield stmt.target.id, FieldRule(_kind(stmt.annotation), bounds, keywords.get("default"))


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _kind(annotation: ast.expr) -> str | None:
    names = set(re.findall(r"[A-Za-z_]+", ast.unparse(annotation))) - {"None", "Optional"}
    if names == {"int"}:
        return "int"
    return "number" if names and names <= {"int", "float"} else None


def _engine_args_owners(root: Path) -> dict[str, str]:
    """`EngineArgs.x: T = SomeConfig.x` -> {"x": "SomeConfig"}: where vLLM itself takes each option's default."""
    tree = _tree(root / "engine" / "arg_utils.py")
    found: dict[str, str] = {}
    for node in tree.body if tree is not None else []:
        if isinstance(node, ast.ClassDef) and node.name == "EngineArgs":
            for stmt in node.body:
                value = stmt.value if isinstance(stmt, ast.AnnAssign) else None
                if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
                    found[ast.unparse(stmt.target)] = value.value.id
    return found
