"""Candidate grids: --set values, grid files, defaults per device, the baseline first, stable keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from stack.errors import ConfigError
from stack.tune.candidates import Candidate, build_candidates, parse_set, split_values


def test_set_values_are_typed_and_brackets_kept() -> None:
    assert split_values("8,16,[1, 2]") == ["8", "16", "[1, 2]"]
    grid = parse_set(["max-num-seqs=8,16", "cudagraph_capture_sizes=[1,2],null", "enforce_eager=true"])
    assert grid == {"max_num_seqs": [8, 16], "cudagraph_capture_sizes": [[1, 2], None], "enforce_eager": [True]}


def test_grid_is_every_combination_with_the_baseline_first() -> None:
    found = build_candidates(["max_num_seqs=8,16", "max_num_batched_tokens=1024,2048"], None, "cpu", False, True)
    assert [c.label for c in found][:2] == ["baseline", "max_num_seqs=8 max_num_batched_tokens=1024"]
    assert len(found) == 5


def test_grid_file_and_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "grid.yaml"
    path.write_text("grid: {max_num_seqs: [4, 8]}\ncandidates:\n  - {max_num_seqs: 4}\n  - {kv_cache_dtype: fp8}\n")
    found = build_candidates([], path, "gpu", True, False)
    assert [c.overrides for c in found] == [{"max_num_seqs": 4}, {"max_num_seqs": 8}, {"kv_cache_dtype": "fp8"}]


def test_bad_grid_file_says_what_to_write(tmp_path: Path) -> None:
    path = tmp_path / "grid.yaml"
    path.write_text("max_num_seqs: [4, 8]\n")
    with pytest.raises(ConfigError, match="needs `grid:` and/or `candidates:`"):
        build_candidates([], path, "cpu", False, False)
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_set(["max_num_seqs"])


def test_defaults_per_device() -> None:
    gpu = build_candidates([], None, "gpu", True, True)
    assert gpu[0].label == "baseline" and {"kv_cache_dtype": "fp8"} in [c.overrides for c in gpu]
    assert all("kv_cache_dtype" not in c.overrides for c in build_candidates([], None, "gpu", False, True))
    assert len(build_candidates([], None, "cpu", False, False)) >= 2


def test_keys_are_stable_and_order_free() -> None:
    a = Candidate({"max_num_seqs": 8, "max_num_batched_tokens": 1024})
    b = Candidate({"max_num_batched_tokens": 1024, "max_num_seqs": 8})
    assert a.key == b.key and len(a.key) == 10 and Candidate({}).label == "baseline"
