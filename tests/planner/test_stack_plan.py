"""The StackPlan (issue 28): immutable, serialisable without a secret, planned once per model, fetched-then-
planned-again only when the download changed what it was planned from."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pydantic
import pytest

from stack.config import load_config
from stack.config.redact import MASK
from stack.errors import ConfigError
from stack.hardware import GpuInfo, HardwareInfo
from stack.models import ModelFiles
from stack.planner.plans import ModelPlan, StackPlan
from stack.planner.stack_planner import REPLANNED, plan_fetched, plan_stack
from tests.conftest import load_catalog

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 64,
        "vocab_size": 49152, "max_position_embeddings": 2048, "torch_dtype": "float32"}
CPU = HardwareInfo(cpu_count=2, ram_total=16 << 30, ram_available=8 << 30)
# Secrets of every kind the configuration may hold (as tests/config/test_redaction.py writes them).
SECRETS = {"DB_PASSWORD": "hunter2-pw", "DATABASE_URL": "postgres://u:pw9@h/db", "SOME_SETTING": "unknown-kind"}
DIGEST = "a" * 64


def tiny_model(root: Path) -> Path:
    folder = root / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    return folder


def secret_config(root: Path):
    env = ", ".join(f"{k}: '{v}'" for k, v in SECRETS.items())
    return load_config(text=f"models:\n  tiny: {{source: {{path: {tiny_model(root)}}}}}\n"
                            f"serve: tiny\nhf_token: hf_the_token_123\n"
                            f"env: {{{env}, VLLM_CPU_KVCACHE_SPACE: '1'}}\nengine: {{api_key: sk-engine-key-123}}\n"
                            f"gateway: {{api_keys: [{{name: team, sha256: '{DIGEST}'}}]}}\n")


def test_the_plan_is_immutable_and_its_json_round_trips(tmp_path: Path) -> None:
    cfg = load_config(text=f"models:\n  tiny: {{source: {{path: {tiny_model(tmp_path)}}}}}\nserve: tiny\n")
    plan = plan_stack(cfg, None, CPU, load_catalog("0.32"))
    with pytest.raises(pydantic.ValidationError):
        plan.default.port = 1  # type: ignore[misc]
    again = StackPlan.from_public(json.loads(json.dumps(plan.public())), plan.secrets())
    # Equal as data (the configuration's record of where each value came from stays with the planning process).
    assert again.public() == plan.public() and again.secrets() == plan.secrets() and again.models == plan.models
    assert again.default.argv() == plan.default.argv() and again.default.fingerprint == plan.default.fingerprint
    assert plan.default.fit is not None and again.default.fit == plan.default.fit  # the fit planner's result too


def test_the_plan_file_and_json_hold_no_secret_and_the_secrets_restore_it(tmp_path: Path) -> None:
    plan = plan_stack(secret_config(tmp_path), None, CPU, load_catalog("0.32"))
    written = plan.save(tmp_path / "state" / "plan.json")
    assert stat.S_IMODE(os.stat(written).st_mode) == 0o600
    text = written.read_text()
    for value in (*SECRETS.values(), "hf_the_token_123", "sk-engine-key-123", DIGEST):
        assert value not in text, value
    public = json.loads(text)
    assert public["models"][0]["env"]["DB_PASSWORD"] == MASK and public["config"]["hf_token"] == MASK
    assert public["models"][0]["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"  # a setting, not a secret: shown
    args = public["models"][0]["args"]
    assert args[args.index("--api-key") + 1] == MASK
    # What travels beside the file (the gateway's stdin) restores every value: the plan runs as planned.
    loaded = StackPlan.load(written, plan.secrets())
    assert loaded.models == plan.models and loaded.config.model_dump() == plan.config.model_dump()
    assert loaded.config.hf_token.get_secret_value() == "hf_the_token_123"  # type: ignore[union-attr]
    assert loaded.config.gateway.api_keys[0].sha256 == DIGEST and loaded.default.env["DB_PASSWORD"] == "hunter2-pw"
    assert "sk-engine-key-123" in loaded.default.argv() and "sk-engine-key-123" not in loaded.default.display()
    # A model's part alone, as an engine container gets it, likewise.
    model = plan.default
    assert ModelPlan.from_public(json.loads(json.dumps(model.public())), model.secrets()) == model
    assert "hunter2-pw" not in json.dumps(model.public())


def test_a_model_whose_files_are_here_is_planned_once_and_not_fetched(tmp_path: Path) -> None:
    cfg = load_config(text=f"models:\n  tiny: {{source: {{path: {tiny_model(tmp_path)}}}}}\n")
    fetched: list[str] = []
    plan = plan_fetched(cfg, "tiny", CPU, load_catalog("0.32"), lambda entry: fetched.append(entry.name))  # type: ignore
    assert fetched == [] and plan.model_files is not None
    assert not any(REPLANNED in n for n in plan.notes)


def test_a_model_fetched_now_is_planned_again_from_its_files_and_says_so(tmp_path: Path, monkeypatch) -> None:
    # A Hub model not on this machine: the download (outside the machine) is stood in for by a folder.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VSTACK_COUNT_FILE", str(tmp_path / "counts"))
    cfg = load_config(text="models:\n  hubbed: {source: {hub: org/hubbed-tiny}}\n", overrides={"cache_dir": tmp_path})
    files = ModelFiles("hubbed", tiny_model(tmp_path), "hub download")
    plan = plan_fetched(cfg, "hubbed", CPU, load_catalog("0.32"), lambda entry: files)
    assert plan.model_arg == str(files.path) and plan.fit is not None  # fitted from the files' own config.json
    assert any(REPLANNED in n for n in plan.notes)
    assert (tmp_path / "counts").read_text().count(" plan hubbed") == 2  # before the download, and from its files


H100 = HardwareInfo(gpus=[GpuInfo(0, "NVIDIA H100 80GB HBM3", int(79.2 * 2**30), int(78.6 * 2**30), "9.0")],
                    cpu_count=16, ram_total=128 << 30, ram_available=120 << 30)


@pytest.mark.parametrize("keeps", [True, False])
def test_one_gpu_model_runs_with_sleep_mode_so_that_down_can_keep_it_asleep(keeps: bool) -> None:
    """adr/0030: sleep mode was on only where the gateway switches models; `vstack down` keeping a single GPU
    model asleep needs it too. Its prefix cache's CPU tier stays off (no switch to keep it for)."""
    cfg = load_config(overrides={"manager": {"down_keeps_asleep": keeps}})
    plan = plan_stack(cfg, "rtx4090-qwen2.5-7b", H100, load_catalog("0.33"))
    model = plan.default
    assert model.can_sleep is keeps and bool(model.engine.get("enable_sleep_mode")) is keeps
    assert ("--enable-sleep-mode" in model.display()) is keeps
    assert any("`vstack down` keeps it asleep" in n for n in plan.notes) is keeps
    assert "kv_offloading_size" not in model.engine and model.prefix_cache_bytes == 0


def test_an_operators_cpu_kv_cache_size_in_the_environment_is_the_plans(tmp_path: Path, monkeypatch) -> None:
    """Exported as vLLM users do, VLLM_CPU_KVCACHE_SPACE sizes the KV cache instead of the RAM free; a profile's
    own value still wins (it is the configuration); a value vLLM cannot read is refused before anything runs."""
    cfg = load_config(text=f"models:\n  tiny: {{source: {{path: {tiny_model(tmp_path)}}}}}\nserve: tiny\n")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    derived = plan_stack(cfg, None, CPU, load_catalog("0.32")).default
    assert derived.env["VLLM_CPU_KVCACHE_SPACE"] == "2"  # 25% of the 8 GiB free
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    given = plan_stack(cfg, None, CPU, load_catalog("0.32")).default
    assert given.env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert "KV cache: 3 GiB (VLLM_CPU_KVCACHE_SPACE, from the environment)" in given.notes
    pinned = load_config(text=f"models:\n  tiny: {{source: {{path: {tmp_path / 'tiny'}}}}}\nserve: tiny\n"
                              "env: {VLLM_CPU_KVCACHE_SPACE: '1'}\n")  # fmt: skip
    assert plan_stack(pinned, None, CPU, load_catalog("0.32")).default.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    for bad in ("1.5", "lots", "0"):
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", bad)
        with pytest.raises(ConfigError) as err:
            plan_stack(cfg, None, CPU, load_catalog("0.32"))
        assert f"VLLM_CPU_KVCACHE_SPACE={bad!r} in the environment is not a whole number of GiB" in err.value.message
        assert "export VLLM_CPU_KVCACHE_SPACE=4" in (err.value.hint or "")


def test_the_consoles_plan_page_shows_the_engines_real_port_never_port_0(tmp_path: Path) -> None:
    """Issue 50: Plan & config showed `vllm serve ... --port 0` (0 only means: a free port at each start)."""
    from stack.assemble.gateways import console_sources

    cfg = load_config(text=f"models:\n  tiny: {{source: {{path: {tiny_model(tmp_path)}}}}}\nserve: tiny\n")
    plan = plan_stack(cfg, None, CPU, load_catalog("0.32"))
    assert plan.default.port == 0
    running = console_sources(plan, port_of=lambda name: 41234 if name == "tiny" else None).engines()  # type: ignore[misc]
    assert " --port 41234 " in running[0]["command"] and "--port 0" not in running[0]["command"]
    stopped = console_sources(plan).engines()  # type: ignore[misc]
    assert " --port <a free port, picked at start> " in stopped[0]["command"]
