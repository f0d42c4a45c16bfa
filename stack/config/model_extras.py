"""What a model config says beyond its source: how its family serves tools and reasoning, what it is
for (generate or embed), and the LoRA adapters served on top of it (adr/0013-model-families-and-adapters.md).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# vLLM's --served-model-name rules are loose; ours keep adapter names usable in URLs and metrics labels.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServingFacts(_Strict):
    """Tool calling, reasoning and chat template facts. Unset fields are inferred from the model's family
    (stack.vllm.families, from config.json and the model's name), and `vstack config render` says which."""

    family: str | None = Field(None, description="a family from stack.vllm.families (qwen2.5, qwen3, llama3, mistral, "
                               "gpt-oss, smollm2, ...); default: inferred from config.json")
    tool_call_parser: str | None = Field(None, description="a tool parser the installed vLLM registers; "
                                         "'none' turns inference off")
    reasoning_parser: str | None = Field(None, description="a reasoning parser the installed vLLM registers; "
                                         "'none' turns inference off")
    auto_tool_choice: bool | None = Field(None, description="tool_choice 'auto' (needs a tool parser)")
    chat_template: str | None = Field(None, description="a chat template file or inline Jinja replacing the "
                                      "model's own")


class AdapterEntry(_Strict):
    """A LoRA adapter served on its base model's engine, asked for by `name` like a model."""

    name: str = Field(description="the name clients ask for, like a model")
    hub: str | None = Field(None, description="Hugging Face Hub repository id of the adapter")
    revision: str = Field("main", description="branch, tag or commit of the Hub repository")
    path: str | None = Field(None, description="a local folder with adapter_config.json and the weights")

    @model_validator(mode="after")
    def _one_source(self) -> AdapterEntry:
        if not _NAME.match(self.name):
            raise ValueError(f"adapter name {self.name!r}: use letters, digits and . _ : - (at most 128)")
        if bool(self.hub) == bool(self.path):
            raise ValueError(f"adapter {self.name!r} needs exactly one of `hub` (a Hub id) or `path` (a folder)")
        return self


class LoraLimits(_Strict):
    """How many adapters the engine holds: `max_loras` in one batch (on the GPU), `max_cpu_loras` loaded
    (in CPU memory); past them the least recently used is evicted. Unset: decided by the planner."""

    max_loras: int | None = Field(None, ge=1, description="adapters in one batch (vLLM --max-loras)")
    max_cpu_loras: int | None = Field(None, ge=1, description="adapters kept loaded (vLLM --max-cpu-loras)")
    max_lora_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] | None = Field(
        None, description="the highest adapter rank the engine accepts (default: the highest listed adapter's)")
    runtime_updates: bool = Field(True, description="allow /admin/adapters to add adapters without a restart")

    @model_validator(mode="after")
    def _cpu_holds_gpu(self) -> LoraLimits:
        if self.max_loras and self.max_cpu_loras and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras}): "
                             "vLLM keeps every adapter of a batch in CPU memory too")
        return self


Task = Literal["generate", "embed"]


# Our names -> vLLM's KVConnectorFactory names. p2p-nccl is kept only to refuse it with the reason: vLLM removed
# P2pNcclConnector upstream (vllm-project/vllm#44854; neither 0.26 nor 0.32 registers it).
CONNECTORS = {"nixl": "NixlConnector"}
GONE_CONNECTORS = {"p2p-nccl": "P2pNcclConnector (removed from vLLM: vllm-project/vllm#44854)"}


class Disaggregation(_Strict):
    """Prefill/decode disaggregation (adr/0052): `prefill` engines compute each prompt's KV cache and hand it
    over vLLM's KV connector to one of `decode` engines, which generates the tokens; the gateway sends each
    request through both (vLLM's proxy flow). Runs on `manager.runtime: ray`, one engine per replica."""

    prefill: int = Field(1, ge=1, description="engines that compute prompts (each a whole copy of the model)")
    decode: int = Field(1, ge=1, description="engines that generate the tokens (each a whole copy of the model)")
    connector: str = Field("nixl", description="vLLM's KV connector: nixl (NixlConnector; its `nixl` wheels on "
                           "the engines' machines)")  # fmt: skip

    @model_validator(mode="after")
    def _known_connector(self) -> Disaggregation:
        if self.connector in GONE_CONNECTORS:
            raise ValueError(f"connector {self.connector!r}: {GONE_CONNECTORS[self.connector]}; use connector: nixl")
        if self.connector not in CONNECTORS:
            raise ValueError(f"connector {self.connector!r} is not one the gateway drives; use one of: "
                             f"{', '.join(CONNECTORS)}")  # fmt: skip
        return self

    @property
    def vllm_connector(self) -> str:
        return CONNECTORS[self.connector]

    def phases(self) -> tuple[str, ...]:
        """Each replica's phase by its index: the prefill engines first."""
        return ("prefill",) * self.prefill + ("decode",) * self.decode
