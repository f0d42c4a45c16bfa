"""What the planner needs to know about a model, read from its config.json.

Only the facts that decide memory: layer and head counts, attention variant (GQA, MLA, sliding window),
experts, vocabulary, the checkpoint dtype and its quantization. Weight bytes come from weights.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stack.planner.errors import ModelShapeError

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}
# Where vLLM looks for a model's context length (config/model.py: _get_and_verify_max_len); it takes the
# smallest of those present.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
                "max_seq_length", "seq_len")
# Model types whose MLP has two matrices (up, down) instead of three (gate, up, down).
UNGATED_MLP = {"gpt2", "gpt_neox", "gptj", "opt", "phi", "falcon", "starcoder2", "bloom", "mpt",
               "gpt_bigcode"}


@dataclass(frozen=True)
class Quantization:
    """How the checkpoint's linear layers are stored. bits=16 means not quantized."""

    method: str | None = None
    bits: int = 16
    group_size: int | None = None
    # GPTQ keeps a permutation index (int32 per input row); AWQ does not.
    has_g_idx: bool = False
    # Asymmetric (AWQ, GPTQ sym=false): a zero point per group as well as a scale.
    zero_point: bool = False

    @property
    def label(self) -> str:
        if self.method is None:
            return "none"
        group = f", group {self.group_size}" if self.group_size else ""
        return f"{self.method} ({self.bits}-bit{group})"

    def bytes_per_weight(self, dtype_bytes: int) -> float:
        """Bytes per parameter of a quantized linear layer, scales and zero points included."""
        if self.bits >= 16:
            return float(dtype_bytes)
        if self.bits == 8:
            return 1.0  # fp8/int8 with per-channel or per-tensor scales: negligible
        per_group = 0.0
        if self.group_size:
            # an fp16 scale and a packed zero point (bits wide) per group of weights
            per_group = (2 + self.bits / 8) / self.group_size
        return self.bits / 8 + per_group


@dataclass(frozen=True)
class ModelShape:
    name: str
    model_type: str
    architecture: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_context: int
    dtype: str
    attention_bias: bool = False
    gated_mlp: bool = True
    # Multi-head latent attention (DeepSeek-V2/V3): one compressed KV vector per token and layer.
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # Sliding-window attention: how many layers use it, and the window.
    sliding_window: int | None = None
    sliding_layers: int = 0
    # Mixture of experts.
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    dense_layers: int = 0
    quantization: Quantization = field(default_factory=Quantization)
    # Gemma 2's tanh cap on the logits (vLLM's LogitsProcessor applies it out of place: a second logits copy).
    logit_softcap: float | None = None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def full_attention_layers(self) -> int:
        return self.num_layers - self.sliding_layers

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.dense_layers if self.is_moe else 0

    @property
    def dtype_bytes(self) -> int:
        # vLLM runs float32 checkpoints in a 16-bit dtype ("auto" downcasts them).
        return min(DTYPE_BYTES.get(self.dtype, 2), 2)

    @property
    def attention_kind(self) -> str:
        if self.is_mla:
            return f"MLA (latent {self.kv_lora_rank} + rope {self.qk_rope_head_dim})"
        kv = self.num_kv_heads
        kind = "MHA" if kv == self.num_attention_heads else f"GQA ({kv} KV heads)"
        if self.sliding_layers:
            kind += f", window {self.sliding_window} on {self.sliding_layers}/{self.num_layers} layers"
        return kind


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    # Multimodal checkpoints keep the language model's facts under text_config.
    text = config.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" in text:
        merged = {**config, **text}
        merged.setdefault("quantization_config", config.get("quantization_config"))
        return merged
    return config


def parse_quantization(config: dict[str, Any]) -> Quantization:
    q = config.get("quantization_config") or {}
    method = (q.get("quant_method") or "").lower() or None
    if method is None:
        return Quantization()
    if method in {"awq", "gptq", "awq_marlin", "gptq_marlin"}:
        zero_point = bool(q.get("zero_point", True)) if method.startswith("awq") else q.get("sym") is False
        return Quantization(method.split("_")[0], int(q.get("bits", 4)), q.get("group_size"),
                            has_g_idx=method.startswith("gptq"), zero_point=zero_point)
    if method == "fp8":
        return Quantization("fp8", 8)
    if method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        bits = [(g.get("weights") or {}).get("num_bits") for g in groups.values()]
        sizes = [(g.get("weights") or {}).get("group_size") for g in groups.values()]
        bits_known = [b for b in bits if b]
        return Quantization("compressed-tensors", min(bits_known) if bits_known else 8,
                            next((s for s in sizes if s), None))
    if method == "bitsandbytes":
        return Quantization("bitsandbytes", 4 if q.get("load_in_4bit") else 8, 64)
    if method in {"mxfp4", "modelopt_fp4", "nvfp4"}:
        return Quantization(method, 4, 32)
    return Quantization(method, int(q.get("bits", 16)), q.get("group_size"))


def _max_context(config: dict[str, Any]) -> int:
    values = [int(config[k]) for k in CONTEXT_KEYS if isinstance(config.get(k), int | float)]
    if not values:
        raise ModelShapeError("config.json names no context length (max_position_embeddings and the like)")
    length = min(values)
    rope = config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type") or rope.get("type")
    # Like vLLM: YaRN and linear/dynamic scaling stretch the original window; llama3 and longrope
    # already write the stretched length into max_position_embeddings.
    if rope_type == "yarn" and "original_max_position_embeddings" in rope:
        length = int(rope["original_max_position_embeddings"] * rope.get("factor", 1))
    elif rope_type in {"linear", "dynamic"}:
        length = int(length * rope.get("factor", 1))
    return length


def _sliding(config: dict[str, Any], num_layers: int) -> tuple[int | None, int]:
    window = config.get("sliding_window")
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        count = sum(1 for t in layer_types if "sliding" in str(t))
        return (int(window), count) if window and count else (None, 0)
    if not window or config.get("use_sliding_window") is False:
        return None, 0
    if window >= _max_context(config):
        return None, 0  # a window as long as the context is full attention
    model_type = config.get("model_type", "")
    if model_type == "gemma2":
        return int(window), (num_layers + 1) // 2  # even layers slide
    if model_type.startswith("gemma3"):
        pattern = int(config.get("sliding_window_pattern", 6))
        return int(window), num_layers - num_layers // pattern
    return int(window), num_layers  # Mistral-7B-v0.1 style: every layer slides


def parse_config(config: dict[str, Any], name: str = "model") -> ModelShape:
    """A ModelShape from a config.json mapping; raises ModelShapeError naming the missing key."""
    cfg = _text_config(config)

    def need(*keys: str) -> Any:
        for key in keys:
            if cfg.get(key) is not None:
                return cfg[key]
        raise ModelShapeError(f"{name}: config.json has no {' / '.join(keys)}")

    hidden = int(need("hidden_size", "n_embd", "d_model"))
    layers = int(need("num_hidden_layers", "n_layer", "num_layers"))
    heads = int(need("num_attention_heads", "n_head"))
    kv_heads = int(cfg.get("num_key_value_heads") or cfg.get("num_kv_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    archs = cfg.get("architectures") or ["unknown"]
    experts = int(cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts") or 0)
    shared = 0
    if cfg.get("n_shared_experts"):
        shared = int(cfg["n_shared_experts"]) * int(cfg.get("moe_intermediate_size") or 0)
    elif cfg.get("shared_expert_intermediate_size"):
        shared = int(cfg["shared_expert_intermediate_size"])
    window, sliding_layers = _sliding(cfg, layers)
    model_type = str(cfg.get("model_type", "unknown"))
    return ModelShape(
        name=name,
        model_type=model_type,
        architecture=str(archs[0]),
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(need("intermediate_size", "n_inner", "ffn_dim")),
        vocab_size=int(need("vocab_size")),
        # Gemma ties its embeddings without saying so in older configs; transformers defaults to True.
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        max_context=_max_context(cfg),
        dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
        attention_bias=bool(cfg.get("attention_bias") or model_type.startswith("qwen2")),
        gated_mlp=model_type not in UNGATED_MLP,
        kv_lora_rank=cfg.get("kv_lora_rank"),
        q_lora_rank=cfg.get("q_lora_rank"),
        qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
        qk_nope_head_dim=int(cfg.get("qk_nope_head_dim") or 0),
        v_head_dim=int(cfg.get("v_head_dim") or 0),
        sliding_window=window,
        sliding_layers=sliding_layers,
        num_experts=experts,
        experts_per_token=int(cfg.get("num_experts_per_tok") or cfg.get("moe_topk") or 0),
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
        if experts else 0,
        shared_expert_intermediate_size=shared,
        dense_layers=int(cfg.get("first_k_dense_replace") or 0) if experts else 0,
        quantization=parse_quantization(cfg),
        logit_softcap=float(cfg["final_logit_softcapping"]) if cfg.get("final_logit_softcapping") else None,
    )
