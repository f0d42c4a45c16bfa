"""`vstack plan` through Typer: the budget and decisions printed, JSON, and refusals with exit code 6."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from stack.cli.plan_cmd import plan_command

runner = CliRunner()


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("plan")(plan_command)
    app.command("other")(lambda: None)  # two commands: `plan` stays a sub-command, as in stack/cli/root.py
    return app


def test_prints_budget_and_decisions() -> None:
    result = runner.invoke(_app(), ["plan", "qwen2.5-7b-instruct", "--gpu", "rtx4090"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for text in ("memory budget (per GPU)", "weights", "KV cache (free)", "57,344 bytes per token",
                 "max_model_len", "profile (hardware.rtx4090)"):
        assert text in result.output


def test_json() -> None:
    result = runner.invoke(_app(), ["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "rtx4090",
                                    "--context", "40960", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["engine_updates"]["kv_cache_dtype"] == "fp8"
    assert plan["kv_cache"]["bytes_per_token"] == 65536
    assert plan["budget_gib"]["weights"] == 14.96


def test_refusal_exit_code_and_message() -> None:
    result = runner.invoke(_app(), ["plan", "Qwen/Qwen2.5-32B-Instruct", "--gpu", "rtx4090"], env={"COLUMNS": "300"})
    assert result.exit_code == 6
    assert ("weights need 61.0 GiB; an RTX 4090 has 24 GiB: use qwen2.5-32b-instruct-awq, 4 GPUs (max_model_len "
            "32768) or 8 GPUs (max_model_len 32768)") in result.output


def test_a_70b_on_an_a100_lists_2_4_and_8_gpus_each_with_its_context() -> None:
    result = runner.invoke(_app(), ["plan", "llama-3.3-70b-instruct", "--gpu", "a100-80gb"], env={"COLUMNS": "300"})
    assert result.exit_code == 6
    listed = "use 2 GPUs (max_model_len 25600), 4 GPUs (max_model_len 32768) or 8 GPUs (max_model_len 32768)"
    assert listed in result.output
    for gpus in (2, 4, 8):
        assert f"\n  {gpus} GPUs: max_model_len " in result.output
    assert "131.4 GiB of weights on one GPU" in result.output and "131.4 GiB of weights per GPU" not in result.output


def test_refusal_as_json() -> None:
    result = runner.invoke(_app(), ["plan", "Qwen/Qwen2.5-32B-Instruct", "--gpu", "rtx4090", "--json"])
    assert result.exit_code == 6
    assert json.loads(result.output)["kind"] == "FitError"


def test_set_and_gpus() -> None:
    result = runner.invoke(_app(), ["plan", "Qwen/Qwen2.5-32B-Instruct", "--gpu", "rtx4090", "--gpus", "4",
                                    "--set", "max_num_seqs=32", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["engine_updates"]["tensor_parallel_size"] == 4
    assert {"key": "max_num_seqs", "value": 32, "source": "profile"}.items() <= next(
        d for d in plan["decisions"] if d["key"] == "max_num_seqs").items()


def test_unknown_hardware() -> None:
    result = runner.invoke(_app(), ["plan", "qwen2.5-7b-instruct", "--gpu", "rtx9090"])
    assert result.exit_code == 2 and "unknown hardware 'rtx9090'" in result.output


def test_bad_set() -> None:
    result = runner.invoke(_app(), ["plan", "qwen2.5-7b-instruct", "--gpu", "l4", "--set", "oops"])
    assert result.exit_code != 0
