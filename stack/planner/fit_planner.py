"""The fit planner's two entry points: `fit_profile` for `vstack up` (a resolved profile on the detected
machine) and `fit_model` for `vstack plan MODEL` (any model on any hardware profile)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from stack.config.engine_values import check_options
from stack.config.origins import suggest
from stack.config.resolve import ResolvedProfile, unconfigured_model
from stack.config.schema import HardwareProfile, StackConfig
from stack.errors import ConfigError
from stack.planner import data_parallel
from stack.planner.decisions import Decision, Fit, Request
from stack.planner.machine import Machine
from stack.planner.model_sources import ModelFacts, load_facts
from stack.planner.parallel import check_tensor_parallel
from stack.planner.sizing import FitInput, decide

QUANTIZED_MARKERS = re.compile(r"(awq|gptq|fp8|int4|int8|w4a16|w8a8|bnb|4bit|8bit)", re.IGNORECASE)


def quantized_variants(cfg: StackConfig | None, hub_id: str | None) -> list[str]:
    """Configured models that are quantized versions of this Hub repository (Qwen/X -> Qwen/X-AWQ)."""
    if cfg is None or not hub_id:
        return []
    base = hub_id.lower()
    return sorted(
        name
        for name, entry in cfg.models.items()
        if entry.source.hub
        and entry.source.hub.lower().startswith(base + "-")
        and QUANTIZED_MARKERS.search(entry.source.hub[len(base) :])
    )


def fit_profile(
    resolved: ResolvedProfile,
    hardware_info: Any | None = None,
    *,
    cfg: StackConfig | None = None,
    model_dir: Path | None = None,
    request: Request | None = None,
    token: str | None = None,
    vllm_defaults: Mapping[str, Any] | None = None,
) -> Fit:
    """Plan a resolved profile: decide what it leaves unset, or raise FitError with the numbers.

    hardware_info: stack.hardware.HardwareInfo as detected (None: the hardware profile's own facts).
    model_dir: the model's local folder when the launcher has it (exact bytes from safetensors headers).
    vllm_defaults: the engine's option defaults (its catalogue), for what the profile leaves to vLLM.
    The result's `engine_updates` (vLLM dest names) and `env_updates` hold only what the profile left
    unset; merge them under the profile's own values.
    """
    source: Any = model_dir if model_dir is not None else resolved.model.source
    facts = load_facts(source, resolved.model.name, token)
    hw = resolved.hardware
    machine = Machine.from_detected(hw, hardware_info) if hardware_info is not None else Machine.from_profile(hw)
    return _plan(facts, hw, machine, resolved.engine, resolved.engine_origins, resolved.env,
                 request or Request(), resolved.model.name, quantized_variants(cfg, resolved.model.source.hub),
                 vllm_defaults or {})  # fmt: skip


def fit_model(
    cfg: StackConfig,
    model: str,
    hardware: str,
    request: Request | None = None,
    engine: dict[str, Any] | None = None,
    token: str | None = None,
    hardware_info: Any | None = None,
) -> Fit:
    """Plan `model` (a configured model name, a Hub repository id or a local folder) on a hardware profile.

    Engine options come from the hardware profile, the model entry (when configured) and `engine`, in that
    order of precedence, like a profile without overrides.
    """
    if hardware not in cfg.hardware:
        known = ", ".join(sorted(cfg.hardware))
        raise ConfigError(f"unknown hardware {hardware!r}", hint=f"use one of: {known}")
    hw: HardwareProfile = cfg.hardware[hardware]
    options: dict[str, Any] = dict(hw.engine)
    origins = {k: f"hardware.{hardware}.engine.{k}" for k in hw.engine}
    env = dict(hw.env)
    hub_id: str | None = None
    profile = cfg.profiles.get(model)
    if profile is not None and profile.model not in cfg.models:
        raise ConfigError(f"profile {model!r} names model {profile.model!r}, which configs/models lacks")
    if profile is not None or model in cfg.models:
        # A profile is planned as its model with the profile's engine options on top: never a Hub lookup.
        name = profile.model if profile is not None else model
        entry = cfg.models[name]
        options.update(entry.engine)
        origins.update({k: f"models.{name}.engine.{k}" for k in entry.engine})
        if profile is not None:
            options.update(profile.engine)
            origins.update({k: f"profiles.{model}.engine.{k}" for k in profile.engine})
            env.update(profile.env)
        facts = load_facts(entry.source, name, token)
        hub_id, label = entry.source.hub, model
    elif unconfigured_model(model) is None:
        known = [*cfg.models, *cfg.profiles]
        raise ConfigError(
            f"{model!r} is not a configured model or profile, a Hub id (org/name) or a folder with "
            f"config.json{suggest(model, known)}",
            hint=f"one of: {', '.join(sorted(known))}",
        )
    else:
        facts = load_facts(model, model, token)
        hub_id, label = (None if Path(model).is_dir() else model), model
    given = dict(engine or {})
    problems = check_options(given, lambda key: f"command line: --set {key}")
    if problems:
        raise ConfigError(problems, hint="give each --set KEY=VALUE a value vLLM accepts")
    for key, value in given.items():
        options[key] = value
        origins[key] = "command line"
    options = {k: v for k, v in options.items() if v is not None}
    request = request or Request()
    machine = (
        Machine.from_detected(hw, hardware_info)
        if hardware_info is not None
        else Machine.from_profile(hw, request.gpus)
    )
    return _plan(facts, hw, machine, options, origins, env, request, label, quantized_variants(cfg, hub_id))


def _plan(
    facts: ModelFacts,
    hw: HardwareProfile,
    machine: Machine,
    engine: dict[str, Any],
    origins: dict[str, str],
    env: dict[str, str],
    request: Request,
    label: str,
    alternatives: list[str],
    vllm_defaults: Mapping[str, Any] | None = None,
) -> Fit:
    gpus = machine.gpu_count if machine.accelerator == "gpu" else None
    check_tensor_parallel(facts.shape, engine, origins, gpus, label)
    data_parallel.check_data_parallel(engine, origins, machine.accelerator, gpus, env, f"hardware {hw.name}")
    ranks = data_parallel.ranks(engine)
    asked = request.concurrency
    if ranks > 1:  # each rank holds its share of the requests asked to fit at once
        request = replace(request, concurrency=data_parallel.per_rank(asked, engine))
    fit = decide(
        FitInput(
            facts.shape,
            facts.weights,
            hw,
            machine,
            dict(engine),
            dict(origins),
            dict(env),
            request,
            label,
            alternatives,
            vllm_defaults or {},
        )
    )
    notes = [f"config: {facts.config_source}; weights: {facts.weights.source}", *fit.notes]
    if ranks <= 1:
        return replace(fit, notes=notes)
    share = f"; the {asked} requests asked to fit at once are {request.concurrency} per rank" if asked > 1 else ""
    kept = Decision("data_parallel_size", ranks, f"set; {ranks} ranks, each a whole copy of the weights with the "
                    f"budget above: KV tokens and concurrency x {ranks}{share}", "profile",
                    origins.get("data_parallel_size", ""))  # fmt: skip
    return replace(fit, data_parallel=ranks, decisions=[*fit.decisions, kept],
                   notes=[*notes, data_parallel.describe(engine, gpus)])  # fmt: skip
