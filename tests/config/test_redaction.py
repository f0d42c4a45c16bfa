"""Redaction by what is secret (issue 17): every env value not known safe, every key the schema marks
secret, vLLM's credential options; the same in `config render`'s text and its --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from stack.config.redact import MASK, is_secret_key, option_is_secret, redact_env
from stack.config.schema import StackConfig

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {"DB_PASSWORD": "hunter2-pw", "GCP_CREDENTIALS": "gcp-cred-json", "DATABASE_URL": "postgres://u:pw9@h/db",
           "SOME_SETTING": "innocent-looking-but-unknown"}  # fmt: skip
ENV_ITEMS = ", ".join(f"{k}: '{v}'" for k, v in SECRETS.items())
CONFIG = f"env: {{{ENV_ITEMS}, VLLM_CPU_KVCACHE_SPACE: '2'}}\nengine: {{api_key: sk-engine-key-123}}\n"


def render(tmp_path: Path, *extra: str) -> str:
    (tmp_path / "cfg.yaml").write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VSTACK_")}
    env.update(PYTHONPATH=str(ROOT), VSTACK_CONFIG=str(tmp_path / "cfg.yaml"), COLUMNS="400", NO_COLOR="1")
    done = subprocess.run([sys.executable, "-m", "stack.entrypoints.cli", "config", "render", *extra], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_text_and_json_hide_the_same_values(tmp_path: Path) -> None:
    text, as_json = render(tmp_path), render(tmp_path, "--json")
    data = json.loads(as_json)
    for name, value in SECRETS.items():
        assert value not in text and value not in as_json
        assert data["env"][name] == MASK and f"{name}='{MASK}'" in text
    assert data["env"]["VLLM_CPU_KVCACHE_SPACE"] == "2" and "VLLM_CPU_KVCACHE_SPACE=2" in text
    assert "sk-engine-key-123" not in text + as_json
    assert data["argv"][data["argv"].index("--api-key") + 1] == MASK


def test_secret_by_what_it_is_not_by_its_name() -> None:
    assert redact_env({"CUDA_VISIBLE_DEVICES": "0", "WHATEVER": "x"}) == {"CUDA_VISIBLE_DEVICES": "0", "WHATEVER": MASK}
    assert option_is_secret("api_key") and option_is_secret("hf_token") and option_is_secret("ssl_keyfile_password")
    assert not option_is_secret("max_num_batched_tokens") and not option_is_secret("kv_cache_dtype")
    assert is_secret_key(StackConfig, ("hf_token",))  # a SecretStr in the schema
    assert is_secret_key(StackConfig, ("models", "m", "env", "DB_URL"))
    assert not is_secret_key(StackConfig, ("models", "m", "env", "HF_HUB_OFFLINE"))
    assert not is_secret_key(StackConfig, ("engine", "max_num_seqs"))


def test_the_plan_vstack_up_hands_its_gateway_hides_them_too(tmp_path: Path) -> None:
    """`vstack plan --json` prints the StackPlan as the gateway process gets it (state_dir/plan.json): the same
    values masked (issue 28); they travel beside it, on the gateway's stdin."""
    (tmp_path / "cfg.yaml").write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VSTACK_")}
    env.update(PYTHONPATH=str(ROOT), VSTACK_CONFIG=str(tmp_path / "cfg.yaml"), HF_HUB_OFFLINE="1",
               VSTACK_STATE_DIR=str(tmp_path / "state"))
    done = subprocess.run([sys.executable, "-m", "stack.entrypoints.cli", "plan", "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for value in (*SECRETS.values(), "sk-engine-key-123"):
        assert value not in done.stdout
    model = json.loads(done.stdout)["models"][0]
    assert all(model["env"][name] == MASK for name in SECRETS) and model["env"]["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert model["args"][model["args"].index("--api-key") + 1] == MASK


def test_a_number_is_never_masked_for_its_name_a_credential_still_is() -> None:
    """`gateway.spill.chars_per_token` ends in "token" as vLLM's credential options do: a number is shown (the
    plan file and `vstack config render` printed it as *** and passed it to the gateway as a secret)."""
    from stack.config.redact import redacted_dump

    cfg = StackConfig.model_validate({
        "engine": {"max_num_batched_tokens": 4096, "hf_token": "hf_secret_9"},
    })  # fmt: skip
    dumped = redacted_dump(cfg)
    assert dumped["gateway"]["spill"]["chars_per_token"] == cfg.gateway.spill.chars_per_token
    assert dumped["engine"]["max_num_batched_tokens"] == 4096
    assert dumped["engine"]["hf_token"] == MASK
