"""Engine option values checked when the configuration loads, before anything is planned or started.

vLLM's parser accepts values it cannot serve (`--max-num-seqs -4`, `--gpu-memory-utilization 1.5`), and
the planner does arithmetic on them: so ranges are checked here, each problem named by file and key.
Sizes written like `32k` are read by vLLM's own `human_readable_int`, so the stack accepts exactly what
`vllm serve` accepts.
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

from stack.config.origins import Origins

# vLLM parses these with human_readable_int (vllm/engine/arg_utils.py, `human_readable_int_args`);
# max_model_len with human_readable_int_or_auto.
HUMAN_INT_OPTIONS = frozenset({"max_model_len", "max_num_batched_tokens", "max_num_scheduled_tokens",
                               "kv_cache_memory_bytes", "safetensors_prefetch_block_size", "max_num_queued_tokens"})
_PARSER_FILES = ("utils/argparse_utils.py", "utils/__init__.py")  # 0.32/0.33, then older versions


@dataclass(frozen=True)
class Range:
    """An integer or number with bounds; `low_open` excludes the lower bound itself (0 < x)."""

    integer: bool
    low: float | None = None
    high: float | None = None
    low_open: bool = False

    def problem(self, value: Any) -> str | None:
        kind = "an integer" if self.integer else "a number"
        if isinstance(value, bool) or not isinstance(value, int if self.integer else int | float):
            return f"must be {kind}, got {value!r}"
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return f"must be {'>' if self.low_open else '>='} {_num(self.low)}, got {value!r}"
        if self.high is not None and value > self.high:
            return f"must be <= {_num(self.high)}, got {value!r}"
        return None


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


POSITIVE = Range(integer=True, low=1)
RANGES: dict[str, Range] = {
    "max_model_len": POSITIVE,
    "max_num_seqs": POSITIVE,
    "max_num_batched_tokens": POSITIVE,
    "max_num_scheduled_tokens": POSITIVE,
    "max_num_queued_tokens": POSITIVE,
    "tensor_parallel_size": POSITIVE,
    "pipeline_parallel_size": POSITIVE,
    "data_parallel_size": POSITIVE,
    "block_size": POSITIVE,
    "max_loras": POSITIVE,
    "max_lora_rank": POSITIVE,
    "max_cpu_loras": POSITIVE,
    "kv_cache_memory_bytes": POSITIVE,
    "gpu_memory_utilization": Range(integer=False, low=0, high=1, low_open=True),
    "swap_space": Range(integer=False, low=0),
    "cpu_offload_gb": Range(integer=False, low=0),
    "max_logprobs": Range(integer=True, low=-1),
}


@cache
def vllm_human_int() -> tuple[Callable[[str], int], Callable[[str], int]] | None:
    """vLLM's own (human_readable_int, human_readable_int_or_auto), taken from its source file.

    Importing vllm costs ~8 s; these two functions need only `re` and `argparse`, so they are compiled
    from the installed vLLM's source without importing the package. None without a vLLM here.
    """
    spec = importlib.util.find_spec("vllm")  # locates the package, does not run it
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    for rel in _PARSER_FILES:
        path = root / rel
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        wanted = [node for node in tree.body if isinstance(node, ast.FunctionDef)
                  and node.name in ("human_readable_int", "human_readable_int_or_auto")]  # fmt: skip
        if len(wanted) == 2:
            namespace: dict[str, Any] = {"re": re, "argparse": argparse}
            exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), namespace)
            return namespace["human_readable_int"], namespace["human_readable_int_or_auto"]
    return None


def parse_size(key: str, value: Any) -> tuple[Any, str | None]:
    """(value as vLLM reads it, problem). `auto`/-1 for max_model_len becomes None: unset, the planner decides."""
    if not isinstance(value, str):
        if key == "max_model_len" and value == -1 and not isinstance(value, bool):
            return None, None
        return value, None
    parsers = vllm_human_int()
    if parsers is None:
        try:
            return int(value), None
        except ValueError:
            return value, f"must be an integer, got {value!r} (sizes like '32k' need vLLM installed to be read)"
    plain, or_auto = parsers
    try:
        parsed = (or_auto if key == "max_model_len" else plain)(value)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        detail = str(exc) if isinstance(exc, argparse.ArgumentTypeError) else "not a number"
        return value, f"must be an integer or a size like '32k' (as vLLM reads it), got {value!r}: {detail}"
    return (None if key == "max_model_len" and parsed == -1 else parsed), None


def engine_mappings(cfg: Any) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every `engine:` mapping of a loaded configuration, with its key path."""
    yield ("engine",), cfg.engine
    for section in ("hardware", "models", "profiles"):
        for name, entry in getattr(cfg, section).items():
            yield (section, name, "engine"), entry.engine


def check_options(options: dict[str, Any], where: Callable[[str], str]) -> list[str]:
    """Normalise sizes in place (`32k` -> 32000) and return every out-of-range value, named by `where(key)`."""
    problems: list[str] = []
    for key in list(options):
        value = options[key]
        if value is None:
            continue  # None unsets an inherited option
        if key in HUMAN_INT_OPTIONS:
            value, problem = parse_size(key, value)
            if problem:
                problems.append(f"{where(key)}: {problem}")
                continue
            options[key] = value
            if value is None:
                continue
        rule = RANGES.get(key)
        problem = rule.problem(value) if rule else None
        if problem:
            problems.append(f"{where(key)}: {problem}")
    return problems


def check_engine_values(cfg: Any, origins: Origins) -> list[str]:
    """check_options on every `engine:` mapping of the configuration, named by file and key path."""
    problems: list[str] = []
    for path, options in engine_mappings(cfg):
        problems += check_options(options, lambda key, p=path: f"{origins.where((*p, key))}: {'.'.join((*p, key))}")
    return problems
