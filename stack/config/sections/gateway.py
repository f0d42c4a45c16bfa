"""The `gateway:` section of the configuration: public port, aliases, cloud deployments, keys, limits.

Secrets never live in this model as plain text: API keys are stored as SHA-256 hashes or as the *name*
of an environment variable, cloud provider keys only as `api_key_env`. Rendering the config (`vstack
config show`) therefore cannot leak one.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stack.config.sections.tenants import AdmissionSettings, TenantConfig

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# litellm_params keys that would carry a secret in clear text; the environment carries them instead.
_SECRET_PARAMS = ("api_key", "aws_secret_access_key", "aws_session_token", "vertex_credentials")


ReplicaRoutingName = Literal["least_outstanding", "prefix_affinity", "round_robin", "kv_events"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KeyRef(_Strict):
    """One accepted key: its SHA-256 (hex) or the environment variable that holds it."""

    name: str = Field("default", description="shown in logs and metrics instead of the key")
    sha256: str | None = Field(None, description="hex SHA-256 of the key (`printf %s KEY | sha256sum`)")
    env: str | None = Field(None, description="environment variable holding the key")
    optional: bool = Field(False, description="an unset `env` variable disables this entry instead of failing")

    @model_validator(mode="after")
    def _one_source(self) -> KeyRef:
        if (self.sha256 is None) == (self.env is None):
            raise ValueError("give exactly one of `sha256` (hash of the key) or `env` (variable holding it)")
        if self.sha256 is not None:
            self.sha256 = self.sha256.lower()
            if not _HEX64.match(self.sha256):
                raise ValueError("sha256 must be 64 hex digits (the SHA-256 of the key, not the key)")
        return self


class CloudDeployment(_Strict):
    """A model reached through a LiteLLM provider (OpenAI, Anthropic, Bedrock, ...)."""

    model_name: str = Field(description="the model group clients (or fallbacks) ask for")
    litellm_params: dict[str, Any] = Field(description="LiteLLM params: model: openai/gpt-4o-mini, api_base, ...")
    api_key_env: str | None = Field(None, description="environment variable holding the provider key")
    context_window: int | None = Field(None, gt=0, description="tokens; used for context-window fallbacks")
    order: int = Field(2, ge=1, description="lower is tried first within a model group (local engines are 1)")
    timeout_s: float | None = Field(None, gt=0, description="per attempt (default: gateway.request_timeout_s)")

    @field_validator("litellm_params")
    @classmethod
    def _no_secrets(cls, v: dict[str, Any]) -> dict[str, Any]:
        if "model" not in v:
            raise ValueError("litellm_params needs `model` (provider/model, e.g. openai/gpt-4o-mini)")
        leaked = [k for k in v if k in _SECRET_PARAMS]
        if leaked:
            raise ValueError(f"{', '.join(leaked)} must not be written in a config; set api_key_env instead")
        from stack.config.litellm_providers import env_references

        reads_env = env_references(v)
        if reads_env:
            raise ValueError(f"{', '.join(reads_env)}: `os.environ/...` values are refused (LiteLLM would read "
                             "any variable); name the key's variable in api_key_env instead")
        return v


class EngineLiveness(_Strict):
    """How the gateway proves each local engine makes progress (adr/0021): a /health probe with a deadline,
    and tokens on the requests it serves. An engine that fails either is `unresponsive`: out of routing and
    /ready, its waiting requests go to a fallback or fail with 503, until it answers again."""

    enabled: bool = Field(True, description="probe local engines and watch their tokens")
    probe_interval_s: float = Field(5, gt=0, description="time between two /health probes of an engine")
    probe_timeout_s: float = Field(5, gt=0, description="a probe not answered 200 within this fails")
    probe_failures: int = Field(2, ge=1, description="failed probes in a row that make an engine unresponsive")
    stall_s: float = Field(
        60, gt=0, description="requests in flight on an engine and no token (no stream chunk, no growth of its "
        "vllm:*_tokens counters) for this long: the engine is stalled, unresponsive",
    )


class SpillSettings(_Strict):
    """Spill before the SLO breaks (adr/0027): a request to a model with a TTFT objective (`models.*.slo`,
    a profile's `slo`, or `slo` here) goes to the model's fallbacks (gateway.fallbacks) when the time to first
    token estimated on its local engines (their queue, their prefill speed learned from recent requests, the
    switch a sleeping model still needs) would exceed `headroom` x the objective's limit."""

    enabled: bool = Field(True, description="estimate each request's time to first token and spill to the "
                          "model's fallbacks when it would break the model's TTFT objective")
    slo: dict[str, str] = Field(
        default_factory=dict, description="model group -> objective, for groups no model config names (engines "
        "attached with --upstream, deployments added through /admin), e.g. {qwen: 'p95_ttft_ms<800'}",
    )
    headroom: float = Field(
        0.9, gt=0, le=2, description="spill when the estimate exceeds this fraction of the objective's TTFT limit",
    )
    min_samples: int = Field(
        8, ge=1, description="streamed requests an engine must have answered before its own fitted line is used "
        "(until then: the per-token prefill time from its vllm:* histograms)",
    )
    half_life: int = Field(200, ge=1, description="requests after which an observation weighs half in the fit")
    chars_per_token: float = Field(4.0, gt=0, description="prompt characters per token until an engine's "
                                   "answers say its own")
    scrape_interval_s: float = Field(1.0, gt=0, description="how often the engines' /metrics are read for it")

    @field_validator("slo")
    @classmethod
    def _slo_parses(cls, value: dict[str, str]) -> dict[str, str]:
        from stack.config.slo import parse_slo

        for group, spec in value.items():
            try:
                parse_slo(spec)
            except ValueError as exc:
                raise ValueError(f"slo.{group}: {exc}") from None
        return value


class GatewayConfig(_Strict):
    """The one public endpoint. Engines stay on loopback behind it."""

    host: str = Field("127.0.0.1", description="where the gateway listens; 0.0.0.0 to serve other machines "
                      "(then set API keys). Engines stay on 127.0.0.1")
    port: int = Field(8000, ge=0, le=65535, description="0 picks a free port")
    aliases: dict[str, str] = Field(
        default_factory=dict,
        description="name -> model group; `default` always exists and points at the served default model",
    )
    cloud: list[CloudDeployment] = Field(default_factory=list)
    fallbacks: dict[str, list[str]] = Field(
        default_factory=dict,
        description="model group -> groups tried when it errors, times out or cools down",
    )
    context_window_fallbacks: dict[str, list[str]] = Field(
        default_factory=dict, description="model group -> groups with a larger context window"
    )
    routing_strategy: Literal[
        "simple-shuffle", "least-busy", "latency-based-routing", "usage-based-routing-v2"
    ] = Field(
        "simple-shuffle", description="among deployments of one model group and order: at random (weighted by a "
        "cloud entry's litellm_params weight), the fewest requests in flight, the lowest recent latency, or the "
        "fewest tokens this minute",
    )
    replica_routing: ReplicaRoutingName = Field(
        "least_outstanding", description="among a model's replicas (manager.runtime: ray): the one with the fewest "
        "requests in flight; the one whose prefix cache holds the prompt's prefix (same prefix or session -> same "
        "replica); in turn; or kv_events: the longest prefix the engines' own KV events say a replica holds, "
        "weighed against its load (its engines publish their KV events; docs/getting-started/ray-cluster.md)",
    )
    replica_routing_models: dict[str, ReplicaRoutingName] = Field(
        default_factory=dict, description="model (name, profile or served name, as manager.ray.replicas) -> its "
        "replica_routing, over the gateway-wide one",
    )
    kv_events_load_weight: float = Field(
        0.5, ge=0, description="kv_events: how much a replica's queued prefill (the uncached prompt tokens of this "
        "gateway's requests on it before their first token) counts against the tokens its cache would save; 1: "
        "the least time to the first token for this request alone (a prefix is then prefilled again elsewhere "
        "whenever its holder has one miss queued, and evicts another); 0: the longest prefix alone",
    )
    kv_events_balance_threshold: int | None = Field(
        32, ge=1, description="kv_events: when the replicas' requests in flight (this gateway's) differ by more "
        "than this, the least busy replica takes the request whatever the caches hold (SGLang router's rule and "
        "default): a prompt every request shares no longer keeps them all on one replica; null: never",
    )
    kv_events_max_blocks: int = Field(
        262_144, ge=1, description="kv_events: KV blocks remembered per replica (the oldest forgotten first); "
        "about 100 bytes each",
    )
    affinity_prefix_chars: int = Field(
        512, ge=16, description="prefix_affinity: how much of the prompt (characters) names its prefix"
    )
    api_keys: list[KeyRef] = Field(
        default_factory=list, description="keys accepted on /v1/*; none configured means no key is required"
    )
    tenants: list[TenantConfig] = Field(
        default_factory=list, description="named keys: a role, allowed models, a priority class and limits each "
        "(docs/guides/teams-and-quotas.md); with any, /v1 needs a key. More are added at run time (`vstack keys add`)",
    )
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings, description="priority and fair "
                                         "admission in front of the local engines")
    admin_key: KeyRef | None = Field(None, description="key for /admin/*; without one, only loopback clients")
    metrics_key: KeyRef | None = Field(None, description="a key for /metrics, /metrics/targets and "
                                       "/metrics/engines/* only (Prometheus' bearer token); client and admin keys "
                                       "open them too. With no key of any kind configured they are open")
    cors_origins: list[str] = Field(default_factory=list, description="CORS is off unless origins are listed")
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="host names (the `Host` header) /admin and /ui answer besides loopback names, IP addresses, "
        "this machine's name and `host`: e.g. the name a Compose gateway is published as; `.example.com` for "
        "its subdomains, `*` for any (turns off the DNS-rebinding check); others get 421",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="addresses or CIDRs of reverse proxies whose X-Forwarded-For (the request log's client) and "
        "X-Forwarded-Proto (the console cookie's Secure flag) are believed; from any other client they are ignored",
    )
    connect_timeout_s: float = Field(5, gt=0, description="to open a connection to a deployment")
    request_timeout_s: float = Field(600, gt=0, description="per attempt, first byte to last")
    num_retries: int = Field(1, ge=0, le=10, description="retries of one deployment before falling back")
    retry_backoff_s: float = Field(0.25, ge=0, description="first retry's wait; doubles each retry")
    allowed_fails: int = Field(3, ge=0, description="failures per minute before a deployment cools down")
    cooldown_s: float = Field(5, ge=0, description="how long a deployment past allowed_fails is left out")
    retry_after_s: int = Field(5, ge=1, description="Retry-After sent with 503 when nothing can serve")
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="larger request bodies get 413")
    max_tokens_limit: int = Field(1_048_576, ge=1, description="larger max_tokens are rejected with 400")
    max_in_flight: int = Field(4096, ge=1, description="concurrent requests before 429")
    drain_grace_s: float = Field(30, ge=0, description="SIGTERM: how long in-flight streams may finish")
    workers: Literal["auto"] | int = Field(
        "auto", description="processes that accept on the port and relay /v1 streams, behind one owner that "
        "decides (admission, quotas, switches, metrics) and serves the rest (adr/0049). 1: the owner alone. "
        "auto: min(8, CPU cores // 4), at least 1 (a 2- or 4-core machine keeps one process; 16 cores get 4)",
    )
    log_requests: bool = Field(False, description="one JSON line per request on the `stack.gateway.requests` "
                               "logger: method, path, status, model, deployment, key name, ms; no bodies, no keys")
    provider_key_envs: list[str] = Field(
        default_factory=list,
        description="more environment variables deployments added through /admin/deployments may name as "
        "api_key_env; the gateway.cloud entries' own api_key_env are always allowed, no other variable ever is",
    )
    docs: bool = Field(True, description="serve /docs and /openapi.json (behind the /v1 keys when keys are set)")
    console: bool = Field(True, description="serve the browser console at /ui/ (login with the admin or an API key "
                          "when keys are set; docs/guides/console.md)")
    header_timeout_s: float = Field(10, gt=0, description="a client must send a request's headers within this")
    body_timeout_s: float = Field(60, gt=0, description="... and its body within this once the headers are in")
    keep_alive_s: float = Field(30, gt=0, description="an idle keep-alive connection is closed after this")
    liveness: EngineLiveness = Field(default_factory=EngineLiveness, description="hung-engine detection")
    spill: SpillSettings = Field(default_factory=SpillSettings, description="spill to fallbacks before a "
                                 "model's TTFT objective breaks")
    internal_networks: list[str] = Field(
        default_factory=list,
        description="where a local deployment added through /admin/deployments may point besides loopback and "
        "the hosts of the engines the gateway starts or was configured with: CIDRs (10.0.0.0/8) or exact host "
        "names (a compose service); the gateway fetches from these, so nothing else is allowed",
    )

    @field_validator("workers")
    @classmethod
    def _workers(cls, v: Literal["auto"] | int) -> Literal["auto"] | int:
        if v != "auto" and not 1 <= v <= 64:
            raise ValueError("gateway.workers: `auto` or a count from 1 (the owner process alone) to 64")
        return v

    @field_validator("internal_networks")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        import ipaddress

        for entry in v:
            if "/" in entry:
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError as exc:
                    raise ValueError(f"internal_networks: {entry!r} is not a network ({exc})") from None
            elif not re.fullmatch(r"[A-Za-z0-9.:_-]+", entry):
                raise ValueError(f"internal_networks: {entry!r} is neither a CIDR nor a host name")
        return v

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, v: list[str]) -> list[str]:
        import ipaddress

        for entry in v:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError as exc:
                raise ValueError(f"trusted_proxies: {entry!r} is not an address or a CIDR ({exc})") from None
        return v

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        for entry in v:
            if entry != "*" and not re.fullmatch(r"\.?[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]", entry):
                raise ValueError(f"allowed_hosts: {entry!r} is not a host name (no scheme, port or path): "
                                 "e.g. gateway.example.com, .example.com or *")
        return v

    @model_validator(mode="after")
    def _admin_key_is_not_a_client_key(self) -> GatewayConfig:
        # The same key in both places: every client could open /admin (checked again on the values at start).
        if self.admin_key is None:
            return self
        for i, ref in enumerate(self.api_keys):
            if (ref.env and ref.env == self.admin_key.env) or (ref.sha256 and ref.sha256 == self.admin_key.sha256):
                same = f"environment variable {ref.env}" if ref.env else "sha256"
                raise ValueError(f"admin_key and api_keys.{i} ({ref.name!r}) are the same key ({same}): a client key "
                                 "would open /admin; give the admin key its own value")
        return self

    @model_validator(mode="after")
    def _tenants_are_apart(self) -> GatewayConfig:
        # A tenant's key opening /admin (the admin key's hash or variable), or two tenants of one name or key.
        names: set[str] = {r.name for r in self.api_keys} | ({self.admin_key.name} if self.admin_key else set())
        keys = {("sha256", r.sha256) if r.sha256 else ("env", r.env): f"api_keys {r.name!r}" for r in self.api_keys}
        if self.admin_key is not None:
            ref = self.admin_key
            keys[("sha256", ref.sha256) if ref.sha256 else ("env", ref.env)] = "admin_key"
        for i, t in enumerate(self.tenants):
            if t.name in names:
                raise ValueError(f"tenants.{i}: the name {t.name!r} is taken (by another tenant, an api_keys entry or "
                                 "the admin key); give each tenant a name of its own")
            names.add(t.name)
            key = ("sha256", t.sha256) if t.sha256 else ("env", t.env)
            if key in keys:
                raise ValueError(f"tenants.{i} ({t.name!r}) has the same key as {keys[key]}: give each tenant a key "
                                 "of its own (`vstack keys add NAME` draws one)")
            keys[key] = f"tenants {t.name!r}"
        return self

    @model_validator(mode="after")
    def _provider_keys_are_not_ours(self) -> GatewayConfig:
        # The gateway's own keys must never be handed to a provider (that is, sent to another host).
        refs = [*self.api_keys, *([self.admin_key] if self.admin_key else []),
                *([self.metrics_key] if self.metrics_key else []), *self.tenants]  # fmt: skip
        ours = {ref.env for ref in refs if ref.env}
        for i, c in enumerate(self.cloud):
            if c.api_key_env in ours:
                raise ValueError(f"cloud.{i}.api_key_env: {c.api_key_env} holds one of the gateway's own keys "
                                 "(api_keys/admin_key); give the provider key its own variable")
        named = ours.intersection(self.provider_key_envs)
        if named:
            raise ValueError(f"provider_key_envs: {', '.join(sorted(named))} holds one of the gateway's own keys")
        return self

    def replica_routing_of(self, *names: str | None) -> str:
        """A model's replica routing: the first of its names (profile, model, served name) that
        replica_routing_models lists, else replica_routing."""
        return next((self.replica_routing_models[n] for n in names if n and n in self.replica_routing_models),
                    self.replica_routing)  # fmt: skip

    @model_validator(mode="after")
    def _no_alias_cycles(self) -> GatewayConfig:
        for start in self.aliases:
            seen, name = {start}, self.aliases[start]
            while name in self.aliases:
                if name in seen:
                    raise ValueError(f"aliases: cycle through {start!r}")
                seen.add(name)
                name = self.aliases[name]
        return self


def cores() -> int:
    """CPU cores this process may run on (a container's or taskset's limit, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_workers(value: Literal["auto"] | int, available: int | None = None) -> int:
    """gateway.workers as a count. auto: one worker per 4 cores, at most 8 (adr/0049): each worker relays up to
    about one core's worth of streams, and the engines' own processes (vLLM's API server, tokenizer, one per
    GPU) need the other cores; below 8 cores one process it stays, as before."""
    if value != "auto":
        return int(value)
    return max(1, min(8, (available if available is not None else cores()) // 4))
