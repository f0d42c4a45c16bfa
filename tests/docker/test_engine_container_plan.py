"""An engine container runs the ModelPlan the gateway handed it (no configuration load, no planning), unless
it cannot run it as it is: another vLLM than the plan was rendered for, or the model's files not in its cache
(issue 28). No Docker needed: the container's entry is called as the container's command line calls it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stack.config import load_config
from stack.engine.docker_site import Site
from stack.hardware import HardwareInfo
from stack.planner.model_planner import plan_model
from stack.vllm.options import VllmCatalog
from tests.conftest import load_catalog

launcher = pytest.importorskip("stack.vllm.launcher")
CPU = HardwareInfo(cpu_count=2, ram_total=16 << 30, ram_available=8 << 30)


def plan_for_this_vllm(tmp_path: Path, version: str | None = None):
    here = launcher.installed_vllm()
    if here is None:
        pytest.skip("needs an installed vLLM (./install.sh --dev)")
    dump = load_catalog("0.32")
    catalog = VllmCatalog(here[0], version or here[1], [])
    catalog.options = dump.options  # this vLLM's name and version, the 0.32 options
    folder = tmp_path / "tiny"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 64,
        "vocab_size": 49152, "max_position_embeddings": 2048, "torch_dtype": "float32"}))
    cfg = load_config(text=f"models:\n  tiny: {{source: {{path: {folder}}}}}\nenv: {{DB_PASSWORD: pw-123}}\n")
    return plan_model(cfg, "tiny", CPU, catalog)


def test_the_container_runs_the_handed_plan_with_its_secrets(tmp_path: Path, monkeypatch) -> None:
    from stack.entrypoints.engine_container import PLAN_SECRETS_ENV, handed_plan

    plan = plan_for_this_vllm(tmp_path)
    site = Site(image="img", network="engines", cache_volume="models", config_source=None, name_prefix="e",
                reach="name", gpus="auto", shm_size=None, pass_env=[])  # fmt: skip
    container = site.container_for("tiny", plan.served_name, False, False)
    container.plan = json.dumps(plan.public())
    command = container.command()
    assert command[command.index("--plan-json") + 1] == container.plan and "pw-123" not in " ".join(command)
    monkeypatch.setenv(PLAN_SECRETS_ENV, json.dumps(plan.secrets()))
    got = handed_plan(container.plan)
    assert got == plan and got.env["DB_PASSWORD"] == "pw-123"


def test_the_container_plans_for_itself_where_the_plan_cannot_run(tmp_path: Path, capsys) -> None:
    from stack.entrypoints.engine_container import handed_plan

    other = plan_for_this_vllm(tmp_path, version="0.0.1")
    assert handed_plan(json.dumps(other.public())) is None
    assert "the plan was rendered for" in capsys.readouterr().out
    elsewhere = plan_for_this_vllm(tmp_path / "x").model_copy(update={"model_arg": str(tmp_path / "not-here")})
    assert handed_plan(json.dumps(elsewhere.public())) is None
    assert "not in this container's cache" in capsys.readouterr().out
    assert handed_plan(None) is None
