"""data_parallel_size (adr/0051): each rank a whole copy of the model on its own tensor x pipeline parallel GPUs,
planned as one engine per GPU and counted times the ranks; refused where the GPUs, the device or the runtime
cannot run it. Pure planner and config tests: no engine starts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from stack.config import StackConfig, load_config
from stack.config.resolve import resolve_profile
from stack.errors import ConfigError
from stack.planner.data_parallel import check_data_parallel
from stack.planner.decisions import Request
from stack.planner.errors import FitError
from stack.planner.fit_planner import fit_model, fit_profile
from stack.planner.stack_planner import refuse_data_parallel_on_ray
from stack.vllm.lora import RUNTIME_ENV

DP4 = "h200x4-llama-3.1-8b-dp4"
PROFILE_FILE = f"configs/profiles/{DP4}.yaml"


def test_each_rank_is_planned_as_one_gpu_and_the_plan_counts_it_four_times(cfg: StackConfig) -> None:
    one = fit_model(cfg, "llama-3.1-8b-instruct", "h200")
    four = fit_profile(resolve_profile(cfg, DP4, "h200-x4"), cfg=cfg)
    # The same budget per GPU as one engine on one H200: weights + KV cache of one rank.
    assert four.budget.as_gib() == one.budget.as_gib()
    assert four.budget.as_gib()["weights"] == 14.96 and four.budget.as_gib()["kv"] == 109.51
    assert four.engine_updates["tensor_parallel_size"] == 1  # 4 GPUs over 4 ranks: one each
    assert (four.kv_tokens, four.max_model_len) == (one.kv_tokens, 32768) == (897_088, 32768)
    assert four.total_kv_tokens == 4 * 897_088 and round(four.total_concurrency, 1) == 109.5
    assert four.summary() == (
        "4 data-parallel ranks x (27.4 requests, 897,088 KV tokens): 109.5 requests of "
        "32,768 tokens at once, 3,588,352 KV tokens"
    )
    kept = next(d for d in four.decisions if d.key == "data_parallel_size")
    assert kept.value == 4 and kept.source == "profile" and kept.origin.startswith(PROFILE_FILE)
    assert "4 ranks x 1 GPU each = 4 of 4 GPUs" in four.notes[-1]
    assert "4 API server processes (vLLM's default: one per rank)" in four.notes[-1]
    assert four.to_dict()["data_parallel"] == {"ranks": 4, "kv_tokens": 3_588_352, "max_concurrency": 109.51}


def test_the_requests_asked_to_fit_at_once_are_shared_by_the_ranks(cfg: StackConfig) -> None:
    with pytest.raises(FitError, match="64 requests of 32768 tokens need"):
        fit_model(cfg, "llama-3.1-8b-instruct", "h200", Request(context=32768, concurrency=64))
    four = fit_model(
        cfg,
        "llama-3.1-8b-instruct",
        "h200",
        Request(context=32768, concurrency=64, gpus=4),
        engine={"data_parallel_size": 4},
    )
    assert four.max_model_len == 32768 and four.total_concurrency >= 64
    assert "the 64 requests asked to fit at once are 16 per rank" in four.decisions[-1].reason


def test_more_ranks_than_gpus_is_refused_naming_the_place_and_the_fix(cfg: StackConfig) -> None:
    # `vstack up` on a host of 2 H200s: the profile's file and key, what it needs, what there is, the fix.
    h200 = SimpleNamespace(name="NVIDIA H200", memory_total=150 * 2**30, memory_free=149 * 2**30)
    two = SimpleNamespace(gpus=[h200, h200], ram_total=2**40, ram_available=2**40)
    with pytest.raises(ConfigError) as up:
        fit_profile(resolve_profile(cfg, DP4, "h200-x4"), two, cfg=cfg)
    assert up.value.message == (
        f"{PROFILE_FILE}: profiles.{DP4}.engine.data_parallel_size: data_parallel_size 4 x "
        "tensor_parallel_size 1 x pipeline_parallel_size 1 needs 4 GPUs; there are 2 "
        "(hardware h200-x4)"
    )
    assert up.value.hint == "set data_parallel_size to 2 or less there, or serve it on hardware with 4 GPUs"
    with pytest.raises(ConfigError, match=f"profiles.{DP4}.engine.data_parallel_size: .* there are 2"):
        fit_model(cfg, DP4, "h200", Request(gpus=2))  # `vstack plan DP4 --gpus 2`
    with pytest.raises(ConfigError, match="tensor_parallel_size 2 x pipeline_parallel_size 1 needs 8 GPUs"):
        fit_model(cfg, DP4, "h200-x4", engine={"tensor_parallel_size": 2})


def test_a_profile_past_its_hardwares_gpus_is_refused_when_the_configuration_loads(tmp_path: Path) -> None:
    user = tmp_path / "cfg.yaml"
    user.write_text(f"profiles:\n  {DP4}:\n    engine: {{data_parallel_size: 8}}\n")
    with pytest.raises(ConfigError) as loaded:
        load_config(user)
    text = "\n".join(loaded.value.problems) if hasattr(loaded.value, "problems") else loaded.value.message
    assert f"cfg.yaml: profiles.{DP4}.engine.data_parallel_size" in text
    assert "needs 8 GPUs; hardware 'h200-x4' has 4" in text and "set data_parallel_size to 4 or less" in text


def test_cpu_profiles_ray_and_runtime_lora_with_several_api_servers_are_refused(cfg: StackConfig) -> None:
    with pytest.raises(ConfigError, match="data_parallel_size 2 on a CPU profile"):
        fit_model(cfg, "smollm2-135m-instruct", "cpu", engine={"data_parallel_size": 2})
    engine, origins = {"data_parallel_size": 2}, {"data_parallel_size": "p.yaml: profiles.p.engine.data_parallel_size"}
    with pytest.raises(ConfigError, match=f"starts 2 API servers, and vLLM refuses {RUNTIME_ENV}") as lora:
        check_data_parallel(engine, origins, "gpu", 2, {RUNTIME_ENV: "True"}, "hardware h200-x2")
    assert "api_server_count: 1" in (lora.value.hint or "")
    check_data_parallel({**engine, "api_server_count": 1}, origins, "gpu", 2, {RUNTIME_ENV: "True"}, "h")  # one: ok
    plan = SimpleNamespace(engine=engine, engine_origins=origins)
    with pytest.raises(ConfigError, match=r"data_parallel_size 2 with manager\.runtime: ray") as ray:
        refuse_data_parallel_on_ray([plan])  # type: ignore[list-item]
    assert "manager.ray.replicas" in (ray.value.hint or "")


def test_vstack_plan_says_the_ranks() -> None:
    from tests.planner.test_cli import _app

    result = CliRunner().invoke(_app(), ["plan", DP4], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "897,088 tokens; 27.4 requests of 32,768 at once (109.51 GiB) per rank" in result.output
    assert (
        "4 data-parallel ranks x (27.4 requests, 897,088 KV tokens): 109.5 requests of 32,768 tokens at once, "
        "3,588,352 KV tokens in all"
    ) in result.output
