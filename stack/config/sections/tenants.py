"""Named keys (tenants) and the gateway's fair admission: `gateway.tenants` and `gateway.admission` (adr/0043).

A tenant is a key with a name, a role, the models it may ask for, a priority class and limits. Its key is
never written here: only its SHA-256 (`vstack keys hash`, or `vstack keys add`, which prints the key once),
or the environment variable that holds it, as `gateway.api_keys` takes them.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
Role = Literal["client", "viewer", "admin"]
Priority = Literal["high", "normal", "low"]
# Lower is served first, as vLLM's --scheduling-policy priority reads a request's `priority`.
PRIORITY_VALUE: dict[str, int] = {"high": -1, "normal": 0, "low": 1}
LIMITS = ("rpm", "tpm", "concurrent", "tokens_per_day", "token_budget", "budget_usd")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TenantLimits(_Strict):
    """What one tenant may use; unset: no limit. Checked before a request reaches an engine (429 otherwise)."""

    rpm: int | None = Field(None, ge=1, description="requests per minute (a sliding 60 s window)")
    tpm: int | None = Field(
        None,
        ge=1,
        description="tokens per minute, prompt and completion (sliding 60 s); a "
        "request reserves its prompt estimate plus max_tokens, settled on its usage",
    )
    concurrent: int | None = Field(None, ge=1, description="requests in flight at once")
    tokens_per_day: int | None = Field(None, ge=1, description="tokens per UTC day")
    token_budget: int | None = Field(None, ge=1, description="tokens in all, across restarts (state_dir/usage.json)")
    budget_usd: float | None = Field(
        None,
        gt=0,
        description="money spent on cloud deployments in all, priced by "
        "LiteLLM's price table; local engines cost nothing",
    )


class TenantConfig(_Strict):
    """One named key: who it is, what it may ask for, how it is served."""

    name: str = Field(pattern=NAME, description="shown in logs, metrics, Activity and Usage instead of the key")
    sha256: str | None = Field(None, description="hex SHA-256 of the key (`vstack keys hash`)")
    env: str | None = Field(None, description="environment variable holding the key")
    role: Role = Field(
        "client",
        description="client: /v1 and the console's viewer role; viewer: the console "
        "and /metrics only, no /v1; admin: /admin, /v1 and the console's admin role",
    )
    models: list[str] = Field(
        default_factory=list, description="model groups, aliases or adapters it may ask for; empty: every model"
    )
    priority: Priority = Field(
        "normal",
        description="admission class: high before normal before low; handed to "
        "engines run with scheduling_policy: priority as the request's `priority`",
    )
    weight: float = Field(1.0, gt=0, le=1000, description="its share against the other tenants of its class")
    spill: bool = Field(
        False,
        description="over a limit (rpm, tpm, concurrent, tokens_per_day), send the request "
        "to the model's fallbacks (gateway.fallbacks: the cloud) instead of refusing it",
    )
    limits: TenantLimits = Field(default_factory=TenantLimits)

    @model_validator(mode="after")
    def _one_source(self) -> TenantConfig:
        if (self.sha256 is None) == (self.env is None):
            raise ValueError(
                f"tenant {self.name!r}: give exactly one of `sha256` (`vstack keys hash`) or `env` "
                "(the variable holding the key); the key itself is never written in a config"
            )
        if self.sha256 is not None:
            self.sha256 = self.sha256.lower()
            if not _HEX64.match(self.sha256):
                raise ValueError(
                    f"tenant {self.name!r}: sha256 must be 64 hex digits (the SHA-256 of the key, not the key)"
                )
        return self


class AdmissionSettings(_Strict):
    """The gateway's admission queue in front of each model's local engines (adr/0043). Off (the default):
    every request goes to its engine at once and waits in the engine's own queue, first come first served."""

    enabled: bool = Field(
        False,
        description="hold requests in the gateway beyond `max_in_engine` per model and "
        "admit them by priority class, then fairly between tenants (weighted fair queueing by "
        "tokens)",
    )
    max_in_engine: int = Field(
        16,
        ge=1,
        description="requests of one model in its engines at once (its engines' batch: max_num_seqs x replicas)",
    )
    per_model: dict[str, int] = Field(default_factory=dict, description="model group -> its own max_in_engine")
    reserve: int = Field(
        0,
        ge=0,
        description="places of max_in_engine a tenant with nothing in the engine can "
        "always have: the others fill at most max_in_engine - reserve (a quiet tenant's first "
        "token then waits for no one's answer)",
    )
    max_queued_per_tenant: int = Field(64, ge=1, description="a tenant's requests waiting here; more get 429")
    queue_timeout_s: float = Field(60, gt=0, description="a request waiting longer gets 429 with Retry-After")
    default_output_tokens: int = Field(
        256, ge=1, description="a request without max_tokens counts this many output tokens until its usage says"
    )
