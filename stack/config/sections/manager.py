"""The `manager:` section of the configuration: which models the gateway may switch between, and how.

Defaults follow what users of llama-swap and Ollama expect (a model loads on its first request and is
unloaded when idle), with the two guards they lack: a minimum residency (no A-B-A-B thrash) and a
bounded queue with a time limit (a request never waits forever behind a switch).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stack.config.switch_schedulers import SCHEDULERS

# What an engine container gets from the gateway's environment (values never logged): Hub access and the
# engine overrides an operator set for the gateway (VSTACK_ENGINE__* are passed whole, by prefix).
PASS_ENV = [
    "HF_TOKEN",
    "HF_ENDPOINT",
    "HF_HUB_OFFLINE",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VSTACK_ENGINE__*",
]


class DockerRuntimeConfig(BaseModel):
    """Where engine containers go when `manager.runtime` is docker. Every default is read from the container
    the gateway runs in (its image, its network, its /cache and configs mounts), so that a compose deployment
    needs none of these; a gateway on a host names at least the image and the network."""

    model_config = ConfigDict(extra="forbid")

    image: str | None = Field(None, description="engine image (default: the image the gateway's container runs)")
    network: str = Field(
        "engines",
        description="network the engines join: its name, or the compose network key of the gateway's "
        "project (engines -> <project>_engines); the gateway must be on it, or reach engines by IP from the host",
    )
    cache_volume: str | None = Field(
        None,
        description="volume or host path mounted at /cache (default: the gateway's /cache; on a host: vstack-models)",
    )
    config_source: str | None = Field(
        None,
        description="host path or volume with configs/, mounted read-only (default: the gateway's own; on a "
        "host: the configs folder in use)",
    )
    name_prefix: str | None = Field(None, description="container names (default: <project>-engine or vstack-engine)")
    gpus: Literal["auto", "none", "all"] | int = Field(
        "auto", description="GPUs per engine container: auto (all when the hardware profile is a GPU), none, all, N"
    )
    pass_env: list[str] = Field(
        default_factory=lambda: list(PASS_ENV),
        description="variables copied from the gateway's environment into engine containers (NAME or PREFIX*)",
    )
    shm_size: str | None = Field(
        None,
        description="/dev/shm of an engine container, where vLLM's workers share tensors (default: 2g on "
        "CPU, 16g for GPU engines, whose tensor-parallel workers exchange through it)",
    )


class RayRuntimeConfig(BaseModel):
    """Where engines go when `manager.runtime` is ray: a Ray cluster's nodes (adr/0017-ray-cluster-runtime.md).
    Ray places and reserves; the stack plans per node, starts vLLM on the chosen nodes and routes among
    the replicas."""

    model_config = ConfigDict(extra="forbid")

    address: str = Field(
        "auto",
        description="the Ray cluster: host:port of its head (GCS), `auto` (RAY_ADDRESS or the local "
        "cluster `ray start --head` made), or ray://host:10001 (Ray Client)",
    )
    namespace: str = Field("vstack", description="Ray namespace of the engine actors and placement groups")
    replicas: dict[str, int] = Field(
        default_factory=dict,
        description="model (name, profile or served name) -> replicas; others get 1",
    )
    cpus_per_engine: float = Field(
        1, gt=0, description="Ray CPUs each engine reserves (a CPU engine's whole compute; a GPU engine's API server)"
    )
    placement_timeout_s: float = Field(
        60, gt=0, description="how long a replica waits for its placement group before it is refused"
    )
    restore: bool = Field(True, description="start a lost replica again where the cluster has room")
    health_interval_s: float = Field(1.0, gt=0, description="how often each replica's /health is asked")
    engine_host: Literal["node", "loopback"] = Field(
        "node",
        description="node: engines listen on their node's cluster IP (an internal network: the gateway "
        "must reach them there); loopback: 127.0.0.1 (a one-machine test cluster)",
    )

    @field_validator("replicas")
    @classmethod
    def _positive(cls, value: dict[str, int]) -> dict[str, int]:
        bad = [f"{k}: {v}" for k, v in value.items() if not isinstance(v, int) or v < 1]
        if bad:
            raise ValueError(f"replicas must be whole numbers >= 1 ({', '.join(bad)})")
        return value


class ManagerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: list[str] = Field(
        default_factory=list,
        description="models or profiles the gateway may serve and switch between; empty: only the served one",
    )
    preload: list[str] | None = Field(
        None, description="started when the gateway starts (default: the served model only)"
    )
    min_residency_s: float = Field(
        20,
        ge=0,
        description="scheduler residency: a model that is in use stays loaded at least this long before "
        "another evicts it",
    )
    quiet_s: float = Field(
        2, ge=0, description="a model without a request for this long may be evicted before min_residency_s"
    )
    scheduler: Literal[tuple(SCHEDULERS)] = Field(  # type: ignore[valid-type]  (the names of the one table)
        "grouped",
        description="when a model waiting for its turn takes the machine from a busy one: grouped (as "
        "soon as as many requests wait for it as the busy one has in flight, else once its oldest request has "
        "waited max_wait_s) or residency (after min_residency_s); adr/0029",
    )
    max_wait_s: float = Field(
        4,
        ge=0,
        description="scheduler grouped: the longest a request waits for its model's turn (plus the "
        "drain of the requests in flight and the switch)",
    )
    queue_max: int = Field(64, ge=0, description="requests per model waiting for a switch; more get 503")
    queue_timeout_s: float = Field(120, gt=0, description="how long a request waits for its model, then 503")
    drain_timeout_s: float = Field(
        60, ge=0, description="how long a switch waits for the evicted model's in-flight requests"
    )
    spill_to_fallback: bool = Field(
        True, description="while a model switches, serve its requests from its configured fallbacks (if any)"
    )
    idle_ttl_s: float = Field(600, ge=0, description="an idle model sleeps (GPU) or stops (CPU) after this; 0: never")
    sleep_ttl_s: float = Field(3600, ge=0, description="a sleeping model is stopped after this long asleep; 0: never")
    sleep: Literal["auto", "off"] = Field(
        "auto", description="auto: engines on a GPU start with --enable-sleep-mode and are put to sleep to switch"
    )
    sleep_level: Literal["auto", 1, 2] = Field(
        "auto",
        description="vLLM sleep level per model: auto (level 1, weights kept in pinned host RAM, while "
        "host_memory_budget holds them, then level 2, weights reloaded from the files), or 1 / 2 for all",
    )
    host_memory_budget_gib: float | None = Field(
        None,
        gt=0,
        description="host RAM the level-1 sleepers' weights may take together (default: "
        "host_memory_fraction of the RAM available at start, less host_per_engine_gib per engine)",
    )
    host_memory_fraction: float = Field(0.7, gt=0, le=1, description="see host_memory_budget_gib")
    host_per_engine_gib: float = Field(
        3.0, ge=0, description="host RAM an engine process takes besides its weights (Python, CUDA, tokenizer)"
    )
    keep_prefix_cache: Literal["auto"] | bool = Field(
        "auto",
        description="GPU engines that sleep keep their prefix cache in pinned host RAM across a switch "
        "(vLLM's KV offloading, CPU tier, and the runtime patch keep-prefix-cache-across-sleep; adr/0027). auto: where "
        "the installed vLLM can; true: as auto, and an error where it cannot; false: off",
    )
    prefix_cache_gib: float | None = Field(
        None,
        gt=0,
        description="host RAM per model for it (default: 4 GiB, or the model's whole GPU KV cache if "
        "smaller); held for the engine's life, counted in the host RAM budget before the level-1 weights",
    )
    overlap_wake: bool = Field(
        True, description="wake the target's weights while the evicted model sleeps when they fit beside it"
    )
    gpu_placement: Literal["spread", "first"] = Field(
        "spread",
        description="on a host of several GPUs, with several local models: spread pins each engine (CUDA_VISIBLE_"
        "DEVICES) to the GPUs the models planned before it use least, so models on different GPUs stay resident "
        "together; first leaves every engine on the first GPUs, as vLLM starts it (adr/0056). An engine whose env "
        "sets CUDA_VISIBLE_DEVICES keeps it",
    )
    sleep_handoff: Literal["auto"] | bool = Field(
        "auto",
        description="a sleeping engine hands its GPU memory to the engine waking in its place, so the "
        "driver does not clear it between them (adr/0016; 8B -> 3B on an H200: 0.44 s vs 0.94 s raw vLLM). auto: "
        "local engines of one GPU each (measured); true: every local GPU engine that sleeps; false: off",
    )
    warm_handoff: bool = Field(
        True,
        description="with the memory handoff, once a started engine has staged its host buffers it sleeps and "
        "wakes once (0.6-0.9 s on an H200; requests queue meanwhile), so its memory is already in the pieces it "
        "hands over and the first switch after a start costs what later ones do (issue 58: the first release of "
        "~98 GiB is cleared by the driver beside the next engine's weight copies; H200: first switch 1.05x steady "
        "with it, 1.40x without; adr/0053). false: no pause after a start, a slower first switch",
    )
    sleep_keeps_weights: bool = Field(
        True,
        description="a level-1 sleep in a switch leaves the sleeping model's weights mapped on the GPU, releasing "
        "(and handing over) only its KV cache, where those weights fit beside the model woken in its place plus "
        "a margin: switching back then maps a KV cache and copies no weights (adr/0058; on an H200, 8B <-> 3B in "
        "0.13-0.14 s instead of 0.28-0.36 s). The sleeping model holds its weights' memory meanwhile; a switch "
        "that needs it has them released (the model stays asleep, its wake copies them as before). false: every "
        "level-1 sleep moves the weights to host RAM",
    )
    handoff_spare: bool = Field(
        False,
        description="with the memory handoff, the memory a switch's evicted model handed over and the woken one did "
        "not take (up to the evicted model's weights) is kept, not freed, for the next wake's weights to map: the "
        "driver then clears no fresh memory under their copies (on the lent x2 H200 the weights' maps took 0.38 s "
        "for 15.5 GiB against 0.05 s for 81.6 GiB handed over: adr/0057). NVML shows that memory in use between "
        "switches; it is freed before any engine starts. Off until a GPU run measures it",
    )
    down_keeps_asleep: bool = Field(
        True,
        description="`vstack down` puts each engine with sleep mode (GPU) to sleep and keeps it, holding its "
        "weights in host RAM within the host RAM budget, so the next `vstack up` wakes it in seconds; engines without "
        "sleep mode stop. `vstack down --all` stops everything (adr/0030)",
    )
    sleep_min_freed: float = Field(
        0.5, gt=0, le=1, description="after a sleep NVML must show this fraction of the engine's memory freed"
    )
    eviction: Literal["lru", "largest"] = Field("lru", description="which resident model gives way first")
    memory_budget_gib: float | None = Field(
        None,
        gt=0,
        description="memory the engines may use together, per GPU on a GPU host (every engine counts its GPUs from "
        "the first; default: one GPU's memory; on the CPU the RAM free at start x memory_headroom)",
    )
    memory_headroom: float = Field(
        0.85, gt=0, le=1, description="CPU: the fraction of free RAM engines may use together"
    )
    restart_max: int = Field(3, ge=0, description="restarts of a crashed engine within restart_window_s")
    restart_window_s: float = Field(600, gt=0, description="see restart_max")
    restart_backoff_s: float = Field(2, ge=0, description="first restart's delay; doubles each time")
    retry_failed_s: float = Field(30, ge=0, description="a failed model is tried again on a request after this")
    runtime: Literal["local", "docker", "ray"] = Field(
        "local",
        description="local: engines are child processes of the gateway; docker: engine containers started "
        "through the Docker socket (manager.docker says where); ray: engines on a Ray cluster's nodes, with "
        "replicas (manager.ray says where)",
    )
    docker: DockerRuntimeConfig = Field(default_factory=DockerRuntimeConfig)
    ray: RayRuntimeConfig = Field(default_factory=RayRuntimeConfig)

    @model_validator(mode="after")
    def _preload_subset(self) -> ManagerConfig:
        extra = [m for m in self.preload or [] if self.models and m not in self.models]
        if extra:
            raise ValueError(f"preload names {', '.join(extra)}, which `models` does not list")
        return self
