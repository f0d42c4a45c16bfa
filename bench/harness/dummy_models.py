"""Model folders for `--load-format dummy` runs: a real model's config.json and a tokenizer vLLM can serve.

No model hub is reachable on the lent GPU machine, and the suite checks shapes, memory and the serving path,
not text: random weights of the real shape load in seconds and use exactly the real memory. The tokenizer
is word-level: its first ids are single characters (so structured output can spell JSON: `{`, `"`, `:`,
letters, digits; no whitespace-only token, so a grammar never loops on blanks), then `t<N>` words up to the
model's vocabulary size. Its decoder concatenates tokens (a JSON answer decodes exactly as generated), and
a chat template joins the messages' contents. Test-only: never ship these folders as models.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "stack" / "planner" / "known_configs"  # the config.json copies the planner ships
SPECIALS = ["<s>", "</s>", "<unk>"]
# Printable ASCII characters, but whitespace, `:` and `,`, which come only as `: ` and `, `: enough to spell
# any JSON answer, and the tool-call formats vLLM holds tool calls to with xgrammar structural tags (hermes
# `<tool_call>{"name": "f", "arguments": {...}}</tool_call>`, llama `{"name": "f", "parameters": ...}`),
# whose separators carry a space. A bare `:` would be a dead end there (no token continues it with the space:
# every token masked, vLLM ends the request with a 500 "grammar rejected tokens [0]"), and a whitespace-only
# token would let random weights pad a JSON answer with blanks until max_tokens. Without a newline token the
# grammar takes hermes' one-line form. tests/gpu/test_driver_cpu.py walks both grammars at random.
CHARS = [c for c in string.printable if not c.isspace() and c not in ":,"] + [": ", ", "]
# Words the tool parsers of the shipped profiles look up in the vocabulary when they start (llama3_json raises
# without its bot token, mistral without [TOOL_CALLS]); hermes finds its tags as text.
PARSER_TOKENS = ["<|python_tag|>", "[TOOL_CALLS]"]
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def fixture_config(name: str) -> dict[str, Any]:
    """A real model's config.json, as the planner ships it in stack/planner/known_configs/ (NAME: org--repo)."""
    path = FIXTURES / f"{name}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in FIXTURES.glob("*.json")))
        raise FileNotFoundError(f"no config fixture {path}; known: {known}")
    return json.loads(path.read_text())


def vocabulary(size: int) -> dict[str, int]:
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for word in [*CHARS, *PARSER_TOKENS]:
        vocab[word] = len(vocab)
    for i in range(len(vocab), size):
        vocab[f"t{i}"] = i
    return vocab


def write_model(folder: Path, config: dict[str, Any]) -> Path:
    """config.json (remote-code hooks dropped: vLLM's own implementation serves it) and the tokenizer files."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in config.items() if k != "auto_map"}
    vocab_size = int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size"))
    # Specials at 0/1/2 whatever the real model used: the dummy weights do not care, the tokenizer must agree.
    config.update(bos_token_id=0, eos_token_id=1, pad_token_id=None)
    quant = config.get("quantization_config") or {}
    if quant.get("quant_method") == "gptq" and not quant.get("modules_in_block_to_quantize"):
        # vLLM finds a GPTQ checkpoint's quantized layers in its safetensors headers when the config does not
        # list them (AutoGPTQConfig.maybe_update_config); a dummy folder has none, so vLLM would load every
        # layer in 16 bits. Say what the real checkpoint's headers say: every linear layer of every block.
        config["quantization_config"] = {**quant, "modules_in_block_to_quantize": [
            ["self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj"], ["self_attn.o_proj"],
            ["mlp.up_proj", "mlp.gate_proj"], ["mlp.down_proj"]]}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    tok = Tokenizer(models.WordLevel(vocab=vocabulary(vocab_size), unk_token="<unk>"))
    # The decoder fuses tokens, so the encoder must split them apart again: `t12t7{` is t12, t7, {. Without
    # this a decoded run of words re-encodes as one unknown word, and vllm bench's random prompts (ids
    # decoded, then encoded again) shrink from 1024 tokens to about 11.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(r"t[0-9]+|."), behavior="isolated")])
    tok.decoder = decoders.Fuse()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 1 << 20, "chat_template": CHAT_TEMPLATE,
    }))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    return folder
