"""Property-based fuzzing of the configuration loader (hypothesis): whatever the file, its bytes or the
VSTACK_* environment hold, loading either gives a configuration whose engine values are in range, or a
ConfigError naming where; never another exception (a traceback for the user)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stack.config import load_config
from stack.config.engine_values import PLANNED, engine_mappings, ranges
from stack.config.schema import StackConfig
from stack.errors import ConfigError

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# the planner's options and some only vLLM bounds (max_logprobs >= -1, cpu_offload_gb >= 0, from its config classes)
RANGED = [*PLANNED, "max_logprobs", "cpu_offload_gb", "max_num_queued_tokens"]
ENGINE_KEYS = [*RANGED, "dtype", "enforce_eager", "max_num_seq", "port", "kv_cache_dtype"]
TOP_KEYS = [*StackConfig.model_fields, "sevre"]
MODEL = "smollm2-135m-instruct"

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(["32k", "1.5K", "auto", "-1", "2M", "0x10", "１０", "1e3", "nan"]),
)  # fmt: skip
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=8), inner, max_size=3), max_leaves=8)  # fmt: skip
engine = st.dictionaries(st.sampled_from(ENGINE_KEYS), scalars, max_size=4)
gateway = st.fixed_dictionaries({}, optional={
    "port": scalars, "fallbacks": st.dictionaries(st.sampled_from([MODEL, "ghost"]),
                                                  st.lists(st.sampled_from([MODEL, "ghost", "gpt-9"]), max_size=2)),
    "aliases": st.dictionaries(st.sampled_from(["fast", "default2"]), st.sampled_from([MODEL, "ghost"])),
    "max_body_bytes": scalars, "header_timeout_s": scalars, "provider_key_envs": st.lists(st.text(max_size=6)),
})  # fmt: skip
documents = st.fixed_dictionaries({}, optional={
    "engine": engine, "gateway": gateway, "serve": st.sampled_from(["auto", MODEL, "ghost", ""]),
    "default_model": st.sampled_from([MODEL, "ghost"]), "port": scalars, "env": st.dictionaries(st.text(max_size=6),
                                                                                                scalars, max_size=2),
    "models": st.dictionaries(st.sampled_from([MODEL, "m2"]), st.fixed_dictionaries({}, optional={
        "engine": engine, "source": st.one_of(scalars, st.fixed_dictionaries({"path": st.text(max_size=6)})),
        "extends": st.sampled_from([MODEL, "m2", "ghost"])}), max_size=2),
    "profiles": st.dictionaries(st.sampled_from(["cpu-smollm2", "p"]), st.fixed_dictionaries({}, optional={
        "engine": engine, "hardware": st.sampled_from(["cpu", "h100-80gb", "ghost"]),
        "model": st.sampled_from([MODEL, "ghost"])}), max_size=2),
    **{key: values for key in TOP_KEYS[:3]},
})  # fmt: skip


def load_or_config_error(**kwargs) -> StackConfig | None:
    try:
        cfg = load_config(**kwargs)
    except ConfigError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
        return None
    for _, options in engine_mappings(cfg):  # what loaded is in range: the planner can do arithmetic on it
        for key, rules in ranges().items():
            if options.get(key) is not None:
                assert all(rule.problem(options[key]) is None for rule in rules), (key, options[key])
    return cfg


@FUZZ
@given(documents)
def test_structured_documents_load_or_are_refused_by_name(doc: dict) -> None:
    load_or_config_error(text=yaml.safe_dump(doc, allow_unicode=True))


@FUZZ
@given(st.text(max_size=200))
def test_any_text_loads_or_is_refused_by_name(text: str) -> None:
    load_or_config_error(text=text)


@FUZZ
@given(st.binary(max_size=120))
def test_any_bytes_in_a_file_load_or_are_refused_by_name(data: bytes) -> None:
    path = Path(tempfile.gettempdir()) / f"vstack-fuzz-{os.getpid()}.yaml"
    path.write_bytes(b"engine:\n  max_num_seqs: 4\n" + data)
    load_or_config_error(config=path)


@FUZZ
@given(st.sampled_from([*RANGED, "dtype", "max_num_seq"]), st.text(max_size=10).filter(lambda s: "\x00" not in s))
def test_any_engine_override_in_the_environment_loads_or_is_refused(key: str, value: str) -> None:
    name = f"VSTACK_ENGINE__{key.upper()}"
    os.environ[name] = value
    try:
        load_or_config_error()
    finally:
        del os.environ[name]


def test_sizes_are_read_as_vllm_reads_them() -> None:
    cfg = load_config(text="engine: {max_model_len: 32k, max_num_batched_tokens: 2K}")
    assert cfg.engine["max_model_len"] == 32_000 and cfg.engine["max_num_batched_tokens"] == 2048
    assert "max_model_len" not in {k for k, v in load_config(text="engine: {max_model_len: auto}").engine.items()
                                   if v is not None}  # fmt: skip
