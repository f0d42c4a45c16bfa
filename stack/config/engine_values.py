"""Engine option values checked when the configuration loads, before anything is planned or started.

vLLM's parser accepts values it cannot serve (`--max-num-seqs -4`, `--gpu-memory-utilization 1.5`); vLLM refuses
them only when it builds its config, at engine start, and the planner does arithmetic on them before that. So
each value is checked here against the bounds vLLM's own config classes declare (stack.config.vllm_rules, read
from the installed vLLM), each problem named by file and key. Sizes written like `32k` are read by vLLM's own
`human_readable_int`, for the options its parser reads that way, so the stack accepts exactly what `vllm serve`
accepts.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from stack.config.origins import Origins
from stack.config.vllm_rules import FieldRule, field_rules, human_int_parsers, size_options


@dataclass(frozen=True)
class Range:
    """An integer or number with bounds; `low_open`/`high_open` exclude the bound itself (0 < x, x < 1)."""

    integer: bool
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    @classmethod
    def of(cls, rule: FieldRule) -> Range:
        b = rule.bounds
        return cls(integer=rule.kind == "int", low=b.get("gt", b.get("ge")), high=b.get("lt", b.get("le")),
                   low_open="gt" in b, high_open="lt" in b)  # fmt: skip

    def problem(self, value: Any) -> str | None:
        kind = "an integer" if self.integer else "a number"
        if isinstance(value, bool) or not isinstance(value, int if self.integer else int | float):
            return f"must be {kind}, got {value!r}"
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return f"must be {'>' if self.low_open else '>='} {_num(self.low)}, got {value!r}"
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            return f"must be {'<' if self.high_open else '<='} {_num(self.high)}, got {value!r}"
        return None


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


# What vLLM does not say and the planner needs: it sizes memory with these, so each must be a positive integer
# whatever vLLM declares. vLLM leaves kv_cache_memory_bytes unbounded, takes max_lora_rank from a list of choices
# (its parser checks them, after the plan) and lets max_model_len be 0 (-1, `auto`, is read as unset here).
# The same holds where no vLLM is installed beside the CLI: vLLM's bounds are then checked by the engine.
POSITIVE = Range(integer=True, low=1)
PLANNED: dict[str, Range] = {
    **dict.fromkeys(("max_model_len", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size",
                     "pipeline_parallel_size", "data_parallel_size", "block_size", "max_loras", "max_lora_rank",
                     "kv_cache_memory_bytes"), POSITIVE),
    "gpu_memory_utilization": Range(integer=False, low=0, low_open=True),
}  # fmt: skip


@cache
def ranges() -> dict[str, list[Range]]:
    """Every option's checks: vLLM's bounds (from the installed vLLM) first, then the planner's."""
    found = {key: [Range.of(rule)] for key, rule in field_rules().items()}
    for key, rule in PLANNED.items():
        found.setdefault(key, []).append(rule)
    return found


def sizes() -> dict[str, bool]:
    """The options read as sizes (`32k`), each with whether `auto`/-1 is taken (and read as unset), from vLLM's
    parser. Without a vLLM beside the CLI, max_model_len (the size the planner decides) still takes `auto`."""
    return size_options() or {"max_model_len": True}


def parse_size(key: str, value: Any) -> tuple[Any, str | None]:
    """(value as vLLM reads it, problem). `auto`/-1 (max_model_len) becomes None: unset, the planner decides."""
    if not isinstance(value, str):
        if sizes().get(key) and value == -1 and not isinstance(value, bool):
            return None, None
        return value, None
    parsers = human_int_parsers()
    if parsers is None:
        try:
            return int(value), None
        except ValueError:
            return value, f"must be an integer, got {value!r} (sizes like '32k' need vLLM installed to be read)"
    plain, or_auto = parsers
    try:
        parsed = (or_auto if sizes().get(key) else plain)(value)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        detail = str(exc) if isinstance(exc, argparse.ArgumentTypeError) else "not a number"
        return value, f"must be an integer or a size like '32k' (as vLLM reads it), got {value!r}: {detail}"
    return (None if sizes().get(key) and parsed == -1 else parsed), None


def engine_mappings(cfg: Any) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every `engine:` mapping of a loaded configuration, with its key path."""
    yield ("engine",), cfg.engine
    for section in ("hardware", "models", "profiles"):
        for name, entry in getattr(cfg, section).items():
            yield (section, name, "engine"), entry.engine


def check_options(options: dict[str, Any], where: Callable[[str], str]) -> list[str]:
    """Normalise sizes in place (`32k` -> 32000) and return every out-of-range value, named by `where(key)`."""
    problems: list[str] = []
    checks = ranges()
    for key in list(options):
        value = options[key]
        if value is None:
            continue  # None unsets an inherited option
        if key in sizes():
            value, problem = parse_size(key, value)
            if problem:
                problems.append(f"{where(key)}: {problem}")
                continue
            options[key] = value
            if value is None:
                continue
        problem = next((p for rule in checks.get(key, ()) if (p := rule.problem(value))), None)
        if problem:
            problems.append(f"{where(key)}: {problem}")
    return problems


def check_engine_values(cfg: Any, origins: Origins) -> list[str]:
    """check_options on every `engine:` mapping of the configuration, named by file and key path."""
    problems: list[str] = []
    for path, options in engine_mappings(cfg):
        problems += check_options(options, lambda key, p=path: f"{origins.where((*p, key))}: {'.'.join((*p, key))}")
    return problems
