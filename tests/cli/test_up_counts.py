"""One `vstack up` loads the configuration once, detects the hardware once and plans each model once.

`vstack up -f` runs everything in one process; the background `vstack up`, whose gateway is another process,
is counted across its processes by tests/cli/test_up_plans_once_e2e.py. Only the serving loop is left out
here (uvicorn's Server.run returns at once): engines would start there, after every count this test makes."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import uvicorn
from typer.testing import CliRunner

from stack.cli import app

pytest.importorskip("vllm", reason="`vstack up` reads the installed vLLM's options")

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 64,
        "vocab_size": 49152, "max_position_embeddings": 2048, "torch_dtype": "float32"}


def count_calls(monkeypatch: pytest.MonkeyPatch, calls: Counter, key: str, original, keyed=None) -> None:
    """Every reference to `original` in the stack's loaded modules now counts its calls."""

    def counted(*args, **kwargs):
        calls[key if keyed is None else f"{key}:{keyed(*args, **kwargs)}"] += 1
        return original(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name == "stack" or name.startswith("stack."):
            for attr, value in list(vars(module).items()):
                if value is original:
                    monkeypatch.setattr(module, attr, counted)


def test_one_up_loads_config_once_detects_once_and_plans_each_model_once(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # fmt: skip
    import stack.assemble.gateways
    import stack.cli.lifecycle
    import stack.engine.launch

    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "config.json").write_text(json.dumps(TINY))
    config = tmp_path / "two-models.yaml"
    config.write_text(f"models:\n  tiny:\n    source: {{path: {tiny}}}\n"
                      "manager:\n  models: [smollm2-135m-instruct, tiny]\n")
    env = {"VSTACK_STATE_DIR": str(tmp_path / "state"), "HF_HUB_OFFLINE": "1"}
    # The default model's files are here first (as after any earlier `vstack up`): a model fetched during `up`
    # is planned twice by design, before the download (refused early if it cannot fit) and from the files.
    pulled = CliRunner().invoke(app, ["--config", str(config), "models", "pull", "smollm2-135m-instruct"], env=env)
    assert pulled.exit_code == 0, pulled.output
    calls: Counter = Counter()
    count_calls(monkeypatch, calls, "load_config", stack.config.loader.load_config)
    count_calls(monkeypatch, calls, "detect", stack.hardware.detect)
    count_calls(monkeypatch, calls, "plan", stack.planner.fit_planner.fit_profile,
                lambda resolved, *a, **k: resolved.model.name)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)  # no serving loop, no engines
    monkeypatch.setattr(stack.assemble.gateways, "start_early", lambda planned: None)  # the default's engine neither

    result = CliRunner().invoke(app, ["--config", str(config), "up", "-f", "--port", "0"], env=env)
    assert result.exit_code == 0, result.output
    assert "console:" in result.output and "/ui/" in result.output  # `vstack up` says where the console is
    assert calls == Counter({"load_config": 1, "detect": 1, "plan:smollm2-135m-instruct": 1, "plan:tiny": 1})


def test_force_is_an_override_recorded_in_the_plan_not_a_variable_for_other_processes(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # fmt: skip
    import os

    import stack.assemble.gateways

    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "config.json").write_text(json.dumps(TINY))
    config = tmp_path / "one.yaml"
    config.write_text(f"models:\n  tiny:\n    source: {{path: {tiny}}}\n")
    state = tmp_path / "state"
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)
    monkeypatch.setattr(stack.assemble.gateways, "start_early", lambda launch: None)
    result = CliRunner().invoke(app, ["--config", str(config), "up", "tiny", "-f", "--force", "--port", "0"],
                                env={"VSTACK_STATE_DIR": str(state), "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "VSTACK_FIT_CHECK" not in os.environ  # nothing left for a process started later to read
    plan = json.loads((state / "plan.json").read_text())
    assert plan["overrides"] == {"fit_check": "warn"} and plan["config"]["fit_check"] == "warn"
    assert plan["target"] == "tiny" and [m["served_name"] for m in plan["models"]] == ["tiny"]
