"""Model families -> tool/reasoning parsers, task embed, LoRA options: decided at plan time, each with its
origin, checked against the parsers the installed vLLM registers. No engine starts here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stack.config import load_config
from stack.config.schema import ModelEntry
from stack.errors import ConfigError
from stack.hardware import detect
from stack.planner.model_planner import plan_model
from stack.vllm.families import FAMILIES, infer_family, registered_parsers, serving_options
from stack.vllm.lora import AdapterError, check_fits, engine_options, inspect
from tests.conftest import load_catalog

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("config", "names", "family"), [
    ({"model_type": "qwen2", "vocab_size": 152064}, ["Qwen/Qwen2.5-7B-Instruct"], "qwen2.5"),
    ({"model_type": "qwen3"}, ["Qwen/Qwen3-8B"], "qwen3"),
    ({"model_type": "llama", "vocab_size": 128256}, ["meta-llama/Llama-3.3-70B-Instruct"], "llama3"),
    ({"model_type": "llama", "vocab_size": 49152}, ["/cache/models/x"], "smollm2"),
    ({"model_type": "mistral"}, ["mistralai/Mistral-7B-Instruct-v0.3"], "mistral"),
    ({"model_type": "gpt_oss"}, ["openai/gpt-oss-20b"], "gpt-oss"),
    ({}, ["Qwen/Qwen3-8B"], "qwen3"),
    ({"model_type": "phi3"}, ["microsoft/Phi-3"], None),
])  # fmt: skip
def test_family_inferred_from_config_json_and_name(config, names, family) -> None:
    assert infer_family(config, names)[0] == family


def test_every_family_parser_is_registered_by_the_installed_vllm() -> None:
    registered = registered_parsers(sys.executable)
    if registered is None:
        pytest.skip("no vLLM installed here")
    for fam in FAMILIES.values():
        assert fam.tool_call_parser is None or fam.tool_call_parser in registered.tool_parsers, fam
        assert fam.reasoning_parser is None or fam.reasoning_parser in registered.reasoning_parsers, fam


def _model(**extra) -> ModelEntry:
    return ModelEntry.model_validate({"name": "m", "source": {"hub": "Qwen/Qwen3-8B"}, **extra})


def test_qwen3_gets_hermes_auto_and_qwen3_reasoning_with_origins() -> None:
    options, origins, notes = serving_options(_model(), None, {}, "configs/models/m.yaml")
    assert options == {"tool_call_parser": "hermes", "enable_auto_tool_choice": True, "reasoning_parser": "qwen3"}
    assert origins["tool_call_parser"].startswith("inferred: family qwen3")
    assert notes[0].startswith("family: qwen3")


def test_stated_facts_win_and_none_turns_inference_off() -> None:
    stated = _model(serving={"tool_call_parser": "none", "reasoning_parser": "deepseek_r1"})
    options, origins, _ = serving_options(stated, None, {}, "my.yaml")
    assert options == {"reasoning_parser": "deepseek_r1"}
    assert origins["reasoning_parser"] == "my.yaml: models.m.serving"
    # An explicit engine option beats both.
    options, _, _ = serving_options(_model(), None, {"tool_call_parser": "pythonic"}, "my.yaml")
    assert "tool_call_parser" not in options and options["enable_auto_tool_choice"] is True


def test_auto_tool_choice_without_a_parser_is_refused() -> None:
    model = ModelEntry.model_validate({"name": "s", "source": {"hub": "org/unknown"},
                                       "serving": {"auto_tool_choice": True}})  # fmt: skip
    with pytest.raises(ConfigError, match="auto_tool_choice: true needs a tool_call_parser"):
        serving_options(model, None, {}, "x.yaml")


def test_unknown_parser_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    if registered_parsers(sys.executable) is None:
        pytest.skip("no vLLM installed here")
    cfg = load_config(text="models:\n  qwen2.5-7b-instruct:\n    serving: {tool_call_parser: hermez}\n")
    with pytest.raises(ConfigError, match=r"'hermez' .* not a parser the installed vLLM registers; did you mean"):
        plan_model(cfg, "qwen2.5-7b-instruct", detect(), load_catalog("0.32"), for_launch=False)


def test_shipped_model_configs_render_their_family_facts() -> None:
    cfg = load_config()
    expected = {"qwen2.5-7b-instruct": ("hermes", None), "llama-3.1-8b-instruct": ("llama3_json", None),
                "qwen3-8b": ("hermes", "qwen3"), "mistral-7b-instruct-v0.3": ("mistral", None),
                "gpt-oss-20b": ("openai", "openai_gptoss"), "smollm2-135m-instruct": ("hermes", None)}  # fmt: skip
    for name, (tool, reasoning) in expected.items():
        plan = plan_model(cfg, name, detect(), load_catalog("0.32"), for_launch=False)
        args = plan.vllm_args()
        assert (f"--tool-call-parser={tool}" in " ".join(args).replace("--tool-call-parser ", "--tool-call-parser=")
                ) == bool(tool), (name, args)
        assert ("--enable-auto-tool-choice" in args) == bool(tool), name
        assert ("--reasoning-parser" in args) == bool(reasoning), name


def test_config_render_shows_the_family_and_parsers() -> None:
    proc = subprocess.run([sys.executable, "-m", "stack.entrypoints.cli", "config", "render", "qwen3-8b"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "--tool-call-parser hermes" in proc.stdout and "--reasoning-parser qwen3" in proc.stdout
    assert "# family: qwen3" in proc.stderr


def test_embed_task_runs_the_pooling_runner() -> None:
    cfg = load_config()
    plan = plan_model(cfg, "all-minilm-l6-v2", detect(), load_catalog("0.32"), for_launch=False)
    assert "--runner" in plan.vllm_args() and "pooling" in plan.vllm_args()
    assert "--tool-call-parser" not in plan.vllm_args()


# -- LoRA -----------------------------------------------------------------------------------------
def _adapter(tmp: Path, name: str = "a", rank: int = 8, base: str = "HuggingFaceTB/SmolLM2-135M-Instruct",
             weights: bool = True) -> Path:
    folder = tmp / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "base_model_name_or_path":
                                                            base, "target_modules": ["q_proj", "v_proj"]}))
    if weights:
        (folder / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    return folder


def _smol(**extra) -> ModelEntry:
    return ModelEntry.model_validate({"name": "smollm2-135m-instruct",
                                      "source": {"hub": "HuggingFaceTB/SmolLM2-135M-Instruct"}, **extra})


def test_adapter_checks_name_the_reason(tmp_path: Path) -> None:
    from stack.config.model_extras import AdapterEntry

    def info(folder: Path):
        return inspect(AdapterEntry(name=folder.name, path=str(folder)), folder)

    good = info(_adapter(tmp_path))
    check_fits(good, _smol(), 8)
    with pytest.raises(AdapterError, match="rank 16 is above the engine's max_lora_rank 8"):
        check_fits(info(_adapter(tmp_path, "big", 16)), _smol(), 8)
    with pytest.raises(AdapterError, match=r"was trained on 'Qwen/Qwen2\.5-7B'"):
        check_fits(info(_adapter(tmp_path, "q", base="Qwen/Qwen2.5-7B")), _smol(), 8)
    with pytest.raises(AdapterError, match=r"no adapter_model\.safetensors"):
        info(_adapter(tmp_path, "empty", weights=False))
    with pytest.raises(AdapterError, match="does not exist"):
        info(tmp_path / "nowhere")


def test_lora_options_from_config_and_planner(tmp_path: Path) -> None:
    from stack.config.model_extras import AdapterEntry

    infos = [inspect(AdapterEntry(name=n, path=str(p)), p)
             for n, p in (("a", _adapter(tmp_path, "a", 8)), ("b", _adapter(tmp_path, "b", 32)))]
    options, origins = engine_options(_smol(), infos, {}, "gpu")
    assert options == {"enable_lora": True, "max_lora_rank": 32, "max_loras": 2, "max_cpu_loras": 2}
    assert origins["max_lora_rank"] == "planner: the highest adapter rank is 32"
    options, origins = engine_options(_smol(lora={"max_loras": 1, "max_cpu_loras": 3}), infos, {"max_loras": 4},
                                      "cpu")  # fmt: skip
    assert options == {"enable_lora": True, "max_lora_rank": 32, "max_cpu_loras": 3}  # engine option wins


def test_bad_lora_config_is_refused_where_it_is_written() -> None:
    with pytest.raises(ValueError, match="max_cpu_loras \\(1\\) must be >= max_loras \\(2\\)"):
        _smol(lora={"max_loras": 2, "max_cpu_loras": 1})
    with pytest.raises(ValueError, match="exactly one of `hub`"):
        _smol(adapters=[{"name": "x"}])
    with pytest.raises(ValueError, match="distinct"):
        _smol(adapters=[{"name": "x", "path": "/a"}, {"name": "x", "path": "/b"}])


def test_a_config_adapter_with_missing_files_stops_the_plan(tmp_path: Path) -> None:
    text = f"models:\n  smollm2-135m-instruct:\n    adapters: [{{name: gone, path: {tmp_path}/gone}}]\n"
    cfg = load_config(text=text)
    with pytest.raises(ConfigError, match=r"adapters: adapter 'gone': folder .* does not exist"):
        plan_model(cfg, "smollm2-135m-instruct", detect(), load_catalog("0.32"), for_launch=False)


def test_planner_accounts_lora_slots_against_the_kv_cache() -> None:
    from stack.planner.fit_planner import fit_model

    cfg = load_config()
    plain = fit_model(cfg, "llama-3.1-8b-instruct", "h100-80gb")
    lora = {"enable_lora": True, "max_loras": 4, "max_lora_rank": 16}
    with_lora = fit_model(cfg, "llama-3.1-8b-instruct", "h100-80gb", engine=lora)
    # Llama 3.1 8B: 16 x (10240 + 8192 + 51200) x 32 layers x 2 bytes per slot, 4 slots = 272 MiB
    assert with_lora.budget.weights - plain.budget.weights == 4 * 16 * 69632 * 32 * 2
    assert with_lora.budget.kv < plain.budget.kv
    assert any(n.startswith("LoRA: 272 MiB for 4 adapter slot(s) at rank 16") for n in with_lora.notes)


@pytest.mark.parametrize(("version", "pinned"), [("0.32", True), ("0.33", True), ("0.26", False)])
def test_smollm2_pins_tool_arguments_where_vllm_can(version: str, pinned: bool) -> None:
    plan = plan_model(load_config(), "smollm2-135m-instruct", detect(), load_catalog(version), for_launch=False)
    assert ("--tool-strict-level" in plan.vllm_args()) == pinned
    assert pinned or any("no --tool-strict-level" in n for n in plan.notes)
