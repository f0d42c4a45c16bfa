"""Rendering engine options into `vllm serve` arguments, for vLLM 0.26, 0.32 and 0.33 (their real option dumps)."""

from __future__ import annotations

import json

import pytest

from stack.errors import ConfigError
from stack.vllm.args import render_engine_args
from stack.vllm.options import VllmCatalog
from tests.conftest import load_catalog


def test_catalogs_are_the_real_option_sets(catalog: VllmCatalog) -> None:
    assert len(catalog.options) > 250
    assert "max_model_len" in catalog and "gpu_memory_utilization" in catalog
    assert "swap_space" not in catalog


def test_false_reaches_vllm_explicitly(catalog: VllmCatalog) -> None:
    # The --config YAML route drops `false`; prefix caching defaults to on in V1, so false must be explicit.
    args = render_engine_args({"enable_prefix_caching": False}, catalog).args
    negative = {"0.26": "--no-enable-prefix-caching", "0.32": "--no-enable-prefix-caching",
                "0.33": "--disable-prefix-caching"}[catalog.version[:4]]
    assert args == [negative]


def test_true_switch_and_store_true_flag(catalog: VllmCatalog) -> None:
    args = render_engine_args({"enforce_eager": True, "disable_log_stats": True}, catalog).args
    assert args == ["--enforce-eager", "--disable-log-stats"]


def test_store_true_false_is_omitted(catalog: VllmCatalog) -> None:
    assert render_engine_args({"disable_log_stats": False}, catalog).args == []


def test_disable_prefixed_dest_in_033_sets_true_with_its_own_flag() -> None:
    cat = load_catalog("0.33")
    assert render_engine_args({"disable_cascade_attn": True}, cat).args == ["--disable-cascade-attn"]
    assert render_engine_args({"disable_cascade_attn": False}, cat).args == ["--enable-cascade-attn"]


def test_lists_become_separate_values(catalog: VllmCatalog) -> None:
    args = render_engine_args({"cudagraph_capture_sizes": [1, 2, 4, 8]}, catalog).args
    assert args == ["--cudagraph-capture-sizes", "1", "2", "4", "8"]


def test_nested_config_objects_are_compact_json(catalog: VllmCatalog) -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}
    args = render_engine_args({"speculative_config": spec, "compilation_config": {"mode": 3}}, catalog).args
    assert args[0] == "--speculative-config" and json.loads(args[1]) == spec
    assert args[2:] == ["--compilation-config", '{"mode":3}']


def test_sampling_defaults_reach_override_generation_config(catalog: VllmCatalog) -> None:
    args = render_engine_args({"override_generation_config": {"temperature": 0.2, "top_p": 0.9}}, catalog).args
    assert args == ["--override-generation-config", '{"temperature":0.2,"top_p":0.9}']


def test_append_options_repeat_the_flag(catalog: VllmCatalog) -> None:
    args = render_engine_args({"middleware": ["a.b", "c.d"]}, catalog).args
    assert args == ["--middleware", "a.b", "--middleware", "c.d"]


def test_unknown_option_suggests_the_real_one(catalog: VllmCatalog) -> None:
    with pytest.raises(ConfigError) as exc:
        origins = {"max_num_seq": "configs/x.yaml: profiles.x.engine.max_num_seq"}
        render_engine_args({"max_num_seq": 8}, catalog, origins)
    text = str(exc.value)
    assert "configs/x.yaml: profiles.x.engine.max_num_seq" in text
    assert f"not an option of vllm {catalog.version}" in text and "did you mean 'max_num_seqs'" in text


def test_bad_choice_and_type(catalog: VllmCatalog) -> None:
    with pytest.raises(ConfigError) as exc:
        render_engine_args({"dtype": "bf16", "max_num_seqs": "many", "gpu_memory_utilization": True}, catalog)
    text = str(exc.value)
    assert "did you mean 'bfloat16'" in text
    assert "`max_num_seqs` expects an integer" in text
    assert "`gpu_memory_utilization` expects a number" in text


def test_switch_needs_a_boolean(catalog: VllmCatalog) -> None:
    with pytest.raises(ConfigError, match="expects true or false"):
        render_engine_args({"enforce_eager": "yes"}, catalog)


@pytest.mark.parametrize("key", ["model", "host", "port", "served_model_name", "config"])
def test_options_the_stack_owns_are_refused(catalog: VllmCatalog, key: str) -> None:
    with pytest.raises(ConfigError, match="is set by the stack"):
        render_engine_args({key: "x"}, catalog)


def test_secrets_are_redacted_in_display(catalog: VllmCatalog) -> None:
    rendered = render_engine_args({"api_key": ["sk-local-123"]}, catalog)
    assert "sk-local-123" in rendered.args
    assert "sk-local-123" not in " ".join(rendered.redacted())


# --- removed options (docs/design/vllm-notes.md table) -------------------------------------------------------


def test_swap_space_is_rejected_with_the_reason_and_nearest_option(catalog: VllmCatalog) -> None:
    with pytest.raises(ConfigError) as exc:
        render_engine_args({"swap_space": 4}, catalog)
    assert "no CPU swap space" in str(exc.value) and "kv_offloading_size" in str(exc.value)


def test_max_seq_len_to_capture_migrates_with_a_warning(catalog: VllmCatalog) -> None:
    rendered = render_engine_args({"max_seq_len_to_capture": 8192}, catalog)
    assert rendered.args == ["--max-cudagraph-capture-size", "8192"]
    assert "max_cudagraph_capture_size" in rendered.warnings[0]


def test_guided_decoding_backend_goes_into_structured_outputs_config(catalog: VllmCatalog) -> None:
    rendered = render_engine_args({"guided_decoding_backend": "xgrammar"}, catalog)
    assert rendered.args == ["--structured-outputs-config", '{"backend":"xgrammar"}']
    assert rendered.warnings


def test_guided_decoding_backend_merges_with_existing_structured_outputs(catalog: VllmCatalog) -> None:
    rendered = render_engine_args(
        {"structured_outputs_config": {"disable_any_whitespace": True}, "guided_decoding_backend": "guidance"},
        catalog,
    )
    assert json.loads(rendered.args[1]) == {"disable_any_whitespace": True, "backend": "guidance"}


def test_disable_mm_preprocessor_cache_maps_to_zero_gib(catalog: VllmCatalog) -> None:
    assert render_engine_args({"disable_mm_preprocessor_cache": True}, catalog).args == ["--mm-processor-cache-gb", "0"]
    assert render_engine_args({"disable_mm_preprocessor_cache": False}, catalog).args == []


def test_lora_extra_vocab_size_is_rejected(catalog: VllmCatalog) -> None:
    with pytest.raises(ConfigError, match="no replacement"):
        render_engine_args({"lora_extra_vocab_size": 256}, catalog)


def test_max_parallel_loading_workers_passes_with_a_warning(catalog: VllmCatalog) -> None:
    rendered = render_engine_args({"max_parallel_loading_workers": 2}, catalog)
    assert rendered.args == ["--max-parallel-loading-workers", "2"]
    assert "ignored" in rendered.warnings[0]


def test_tokenizer_mode_slow_only_exists_up_to_026() -> None:
    assert render_engine_args({"tokenizer_mode": "slow"}, load_catalog("0.26")).args == ["--tokenizer-mode", "slow"]
    for version in ("0.32", "0.33"):
        with pytest.raises(ConfigError, match=r"removed after vLLM 0\.26"):
            render_engine_args({"tokenizer_mode": "slow"}, load_catalog(version))


def test_load_format_bitsandbytes_becomes_quantization_after_026() -> None:
    rendered = render_engine_args({"load_format": "bitsandbytes"}, load_catalog("0.33"))
    assert rendered.args == ["--quantization", "bitsandbytes"]
    assert render_engine_args({"load_format": "bitsandbytes"}, load_catalog("0.26")).args == \
        ["--load-format", "bitsandbytes"]


def test_options_removed_between_026_and_032() -> None:
    assert render_engine_args({"calculate_kv_scales": True}, load_catalog("0.26")).args == ["--calculate-kv-scales"]
    with pytest.raises(ConfigError, match=r"not an option of vllm 0\.32\.0"):
        render_engine_args({"calculate_kv_scales": True}, load_catalog("0.32"))


def test_sleep_mode_backend_is_new_in_033() -> None:
    assert render_engine_args({"sleep_mode_backend": "cumem"}, load_catalog("0.33")).args[0] == "--sleep-mode-backend"
    with pytest.raises(ConfigError):
        render_engine_args({"sleep_mode_backend": "cumem"}, load_catalog("0.32"))
