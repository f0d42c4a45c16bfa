"""A profile resolved: its hardware, its model, and the engine options merged in order of precedence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stack.config.origins import suggest
from stack.config.schema import HardwareProfile, ModelEntry, StackConfig
from stack.errors import ConfigError


@dataclass
class ResolvedProfile:
    name: str
    description: str
    hardware: HardwareProfile
    model: ModelEntry
    # Merged: hardware < model < profile < VSTACK_ENGINE__* / CLI. A None value unsets an inherited option.
    engine: dict[str, Any]
    engine_origins: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def served_name(self) -> str:
        return self.model.api_name


def resolve_profile(cfg: StackConfig, name: str | None, detected_hardware: str) -> ResolvedProfile:
    """name: a profile, a model (served on the detected hardware), `auto`, or None for `serve:`."""
    target = name or cfg.serve
    layers: list[tuple[tuple[str, ...], dict[str, Any]]] = []
    if target in cfg.profiles:
        prof = cfg.profiles[target]
        hw_name, model_name, description = prof.hardware, prof.model, prof.description
        profile_layer = [(("profiles", target, "engine"), prof.engine)]
        profile_env = prof.env
    elif target == "auto" or target in cfg.models:
        model_name = cfg.default_model if target == "auto" else target
        # A profile written for exactly this hardware and model carries its tuned overrides: use it.
        matching = [n for n, p in cfg.profiles.items() if p.hardware == detected_hardware and p.model == model_name]
        if matching:
            return resolve_profile(cfg, sorted(matching)[0], detected_hardware)
        hw_name, description, profile_layer, profile_env = detected_hardware, "", [], {}
        target = f"{hw_name}/{model_name}"
    else:
        known = [*cfg.profiles, *cfg.models, "auto"]
        raise ConfigError(
            f"unknown profile or model {target!r}{suggest(target, known)}",
            hint=f"use one of: {', '.join(sorted(known))} (see `vstack config validate`)",
        )
    if hw_name not in cfg.hardware:
        raise ConfigError(f"unknown hardware profile {hw_name!r}{suggest(hw_name, cfg.hardware)}")
    hardware, model = cfg.hardware[hw_name], cfg.models[model_name]
    layers.append((("hardware", hw_name, "engine"), hardware.engine))
    layers.append((("models", model_name, "engine"), model.engine))
    layers.extend(profile_layer)
    layers.append((("engine",), cfg.engine))

    engine: dict[str, Any] = {}
    origins: dict[str, str] = {}
    generation = model.sampling.as_generation_config()
    if generation:
        engine["override_generation_config"] = generation
        where = cfg.where("models", model_name, "sampling")
        origins["override_generation_config"] = f"{where}: models.{model_name}.sampling"
    for path, options in layers:
        for key, value in options.items():
            if key == "override_generation_config" and isinstance(value, dict):
                value = {**engine.get(key, {}), **value}
            engine[key] = value
            origins[key] = f"{cfg.where(*path, key)}: {'.'.join((*path, key))}"
    engine = {k: v for k, v in engine.items() if v is not None}
    env = {**hardware.env, **model.env, **profile_env, **cfg.env}
    return ResolvedProfile(target, description, hardware, model, engine, origins, env)
