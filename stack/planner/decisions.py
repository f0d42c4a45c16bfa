"""What the fit planner decides for one model on one machine (a `Fit`): the decisions with their reasons, the
budget, and the updates to apply. A Fit is one input of the model's plan (stack.planner.plans.ModelPlan),
kept in it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from stack.planner.memory import GIB, Budget, KvGeometry
from stack.planner.model_meta import ModelShape
from stack.planner.weights import Weights


@dataclass(frozen=True)
class Request:
    """What the user asks of the fit (all optional): a context length, how many requests of that length
    must fit at once, and how many GPUs there are (default: the hardware profile's count)."""

    context: int | None = None
    concurrency: int = 1
    gpus: int | None = None


@dataclass(frozen=True)
class Decision:
    key: str
    value: Any
    reason: str
    # "planner" (decided here), "profile" (set by the configuration; `origin` says where), "vllm" (default)
    source: str
    origin: str = ""


@dataclass(frozen=True)
class Fit:
    """One model fitted on one machine: its memory budget, KV cache geometry and each decided setting."""

    model: str
    hardware: str
    shape: ModelShape
    weights: Weights
    budget: Budget
    kv: KvGeometry
    max_model_len: int
    kv_tokens: int
    max_concurrency: float
    decisions: list[Decision] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # data_parallel_size: ranks of one engine, each a whole copy with the budget, KV tokens and concurrency above
    data_parallel: int = 1

    @property
    def total_kv_tokens(self) -> int:
        """KV tokens over every data-parallel rank (kv_tokens is one rank's: what vLLM logs per engine core)."""
        return self.kv_tokens * self.data_parallel

    @property
    def total_concurrency(self) -> float:
        """Requests of max_model_len held at once over every data-parallel rank."""
        return self.max_concurrency * self.data_parallel

    def summary(self) -> str:
        """"N requests of L tokens at once, T KV tokens": over all ranks, with one rank's when there are several."""
        line = (f"{self.total_concurrency:.1f} requests of {self.max_model_len:,} tokens at once, "
                f"{self.total_kv_tokens:,} KV tokens")
        if self.data_parallel > 1:
            line = (f"{self.data_parallel} data-parallel ranks x ({self.max_concurrency:.1f} requests, "
                    f"{self.kv_tokens:,} KV tokens): {line}")
        return line

    @property
    def engine_updates(self) -> dict[str, Any]:
        """vLLM options the profile left unset, as decided here (dest names, e.g. max_model_len)."""
        return {d.key: d.value for d in self.decisions if d.source == "planner" and not d.key.isupper()}

    @property
    def env_updates(self) -> dict[str, str]:
        """Environment variables the profile left unset (VLLM_CPU_KVCACHE_SPACE on the CPU build)."""
        return {d.key: str(d.value) for d in self.decisions if d.source == "planner" and d.key.isupper()}

    def log_lines(self) -> list[str]:
        """One line per decision, for `vstack up`'s log."""
        return [f"{d.key}={d.value} ({d.source}{': ' + d.origin if d.origin else ''}): {d.reason}"
                for d in self.decisions]

    def to_dict(self) -> dict[str, Any]:
        s = self.shape
        return {
            "model": self.model,
            "hardware": self.hardware,
            "shape": {"architecture": s.architecture, "layers": s.num_layers, "attention": s.attention_kind,
                      "experts": s.num_experts, "quantization": s.quantization.label, "dtype": s.dtype,
                      "max_context": s.max_context},
            "weights": {"gib": round(self.weights.total_bytes / GIB, 2), "source": self.weights.source},
            "budget_gib": {"device": self.budget.device, **self.budget.as_gib()},
            "kv_cache": {"bytes_per_token": self.kv.bytes_per_token, "block_size": self.kv.block_size,
                         "dtype_bytes": self.kv.dtype_bytes, "tensor_parallel_size": self.kv.tp,
                         "tokens": self.kv_tokens, "max_model_len": self.max_model_len,
                         "max_concurrency": round(self.max_concurrency, 2)},
            "data_parallel": {"ranks": self.data_parallel, "kv_tokens": self.total_kv_tokens,
                              "max_concurrency": round(self.total_concurrency, 2)},
            "decisions": [asdict(d) for d in self.decisions],
            "engine_updates": self.engine_updates,
            "env_updates": self.env_updates,
            "notes": self.notes,
        }
