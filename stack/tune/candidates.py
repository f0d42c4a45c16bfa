"""Candidate engine settings for `vstack tune`: a grid from --set, a grid file, or the defaults per device.

A candidate is a mapping of engine options (vLLM dest names) laid over the profile, the highest layer
(like VSTACK_ENGINE__*). `null` unsets an option: vLLM then picks its own default. The empty candidate is
the baseline, the profile as it is.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stack.errors import ConfigError

# Measured on an H200 (../shared/gpu): vLLM's defaults beat the often-recommended 16384/256 on TTFT, so the
# grid spans both sides of the default token budget instead of only raising it.
GPU_GRID: list[dict[str, Any]] = [
    {"max_num_batched_tokens": 2048},
    {"max_num_batched_tokens": 4096},
    {"max_num_batched_tokens": 16384},
    {"max_num_batched_tokens": 16384, "max_num_seqs": 256},
]
GPU_FP8: list[dict[str, Any]] = [{"kv_cache_dtype": "fp8"}]
CPU_GRID: list[dict[str, Any]] = [{"max_num_seqs": 4}, {"max_num_seqs": 32, "max_num_batched_tokens": 4096}]


@dataclass(frozen=True)
class Candidate:
    overrides: dict[str, Any]

    @property
    def key(self) -> str:
        """Stable across runs and processes: resume finds a candidate's earlier result by it."""
        blob = json.dumps(self.overrides, sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:10]

    @property
    def label(self) -> str:
        if not self.overrides:
            return "baseline"
        return " ".join(f"{k}={_show(v)}" for k, v in self.overrides.items())


def _show(value: Any) -> str:
    return "default" if value is None else json.dumps(value) if isinstance(value, list | dict) else str(value)


def split_values(text: str) -> list[str]:
    """'8,16,[1,2]' -> ['8', '16', '[1,2]']: commas inside brackets belong to the value."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse_set(options: list[str]) -> dict[str, list[Any]]:
    """--set max_num_seqs=8,16 --set enforce_eager=true -> {'max_num_seqs': [8, 16], 'enforce_eager': [True]}."""
    grid: dict[str, list[Any]] = {}
    for option in options:
        key, sep, values = option.partition("=")
        key = key.strip().replace("-", "_").removeprefix("__")
        if not sep or not key or not values.strip():
            raise ConfigError(f"--set {option!r}: expected KEY=VALUE[,VALUE...]",
                              hint="e.g. --set max_num_seqs=8,16 --set max_num_batched_tokens=2048,8192")
        grid[key] = [yaml.safe_load(v) for v in split_values(values)]
    return grid


def expand(grid: dict[str, list[Any]]) -> list[Candidate]:
    keys = list(grid)
    return [Candidate(dict(zip(keys, combo, strict=True))) for combo in itertools.product(*grid.values())]


def load_grid_file(path: Path) -> list[Candidate]:
    """A YAML file with `grid: {key: [values]}` (every combination) and/or `candidates: [{...}, ...]`."""
    from stack.config.loader import display_path, read_yaml

    shown = display_path(path)
    data = read_yaml(path, label=shown)
    if not isinstance(data, dict) or not ({"grid", "candidates"} & set(data)):
        raise ConfigError(f"{shown}: a grid file needs `grid:` and/or `candidates:`",
                          hint="grid: {max_num_seqs: [8, 16]}  or  candidates: [{max_num_seqs: 8}, {}]")
    unknown = set(data) - {"grid", "candidates"}
    if unknown:
        raise ConfigError(f"{shown}: unknown key(s) {', '.join(sorted(unknown))}", hint="keep grid: and candidates:")
    found: list[Candidate] = []
    grid = data.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) for v in grid.values()):
        raise ConfigError(f"{shown}: grid: must map option names to lists of values",
                          hint="grid: {max_num_batched_tokens: [2048, 8192]}")
    if grid:
        found += expand({str(k).replace("-", "_"): v for k, v in grid.items()})
    for i, entry in enumerate(data.get("candidates") or []):
        if not isinstance(entry, dict):
            raise ConfigError(f"{shown}: candidates[{i}]: must be a mapping of engine options (or {{}})")
        found.append(Candidate({str(k).replace("-", "_"): v for k, v in entry.items()}))
    return found


def default_candidates(accelerator: str, fp8: bool) -> list[Candidate]:
    if accelerator == "gpu":
        return [Candidate(c) for c in GPU_GRID + (GPU_FP8 if fp8 else [])]
    return [Candidate(c) for c in CPU_GRID]


def build_candidates(sets: list[str], grid_file: Path | None, accelerator: str, fp8: bool,
                     baseline: bool) -> list[Candidate]:
    """Baseline first (when asked), then the grid; duplicates dropped, order kept."""
    found: list[Candidate] = []
    if grid_file:
        found += load_grid_file(grid_file)
    if sets:
        found += expand(parse_set(sets))
    if not found:
        found = default_candidates(accelerator, fp8)
    if baseline:
        found.insert(0, Candidate({}))
    unique: dict[str, Candidate] = {}
    for c in found:
        unique.setdefault(c.key, c)
    return list(unique.values())
