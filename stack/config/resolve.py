"""A profile resolved: its hardware, its model, and the engine options merged in order of precedence."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stack.config.model_extras import Disaggregation
from stack.config.origins import suggest
from stack.config.schema import HardwareProfile, ModelEntry, ModelSource, StackConfig
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
    slo: list[str] = field(default_factory=list)  # the profile's objectives, else its model's
    disaggregation: Disaggregation | None = None  # the profile's, else its model's (adr/0052)
    disaggregation_origin: str = ""  # where it was set, for error messages

    @property
    def served_name(self) -> str:
        return self.model.api_name

    @property
    def ad_hoc(self) -> bool:
        """Served by a Hub id or a folder, with no entry in configs/models (see `unconfigured_model`)."""
        return self.model.description == AD_HOC


AD_HOC = "not configured: served by its Hub id or folder, settings planned for this machine"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def unconfigured_model(target: str) -> ModelEntry | None:
    """A model named by a local folder (with config.json) or a Hugging Face Hub id (`org/name`) that no
    configs/models entry describes: an entry made up for it, so that `vstack up NAME` serves it as
    `vstack plan NAME` plans it. Served as the Hub id, or as the folder's name; the planner and the family
    inference (config.json) decide the rest. None when `target` is neither."""
    folder = Path(target).expanduser()
    if (folder / "config.json").is_file():
        folder = folder.resolve()
        return ModelEntry(name=_slug(folder.name), served_name=folder.name, description=AD_HOC,
                          source=ModelSource(path=str(folder)))
    if HUB_ID.match(target) and not folder.exists():
        return ModelEntry(name=_slug(target.split("/")[-1]), served_name=target, description=AD_HOC,
                          source=ModelSource(hub=target))
    return None


def _slug(name: str) -> str:
    """A name fit for cache folders, log files and container names."""
    return re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-.") or "model"


def model_entry(cfg: StackConfig, name: str) -> ModelEntry | None:
    """A configured model by name, else one made up for a Hub id or a folder (unconfigured_model)."""
    return cfg.models.get(name) or unconfigured_model(name)


def resolve_profile(cfg: StackConfig, name: str | None, detected_hardware: str) -> ResolvedProfile:
    """name: a profile, a model (served on the detected hardware), `auto`, or None for `serve:`."""
    target = name or cfg.serve
    layers: list[tuple[tuple[str, ...], dict[str, Any]]] = []
    if target in cfg.profiles:
        prof = cfg.profiles[target]
        hw_name, model_name, description = prof.hardware, prof.model, prof.description
        profile_layer = [(("profiles", target, "engine"), prof.engine)]
        profile_env, profile_slo = prof.env, prof.slo
        profile_split = (prof.disaggregation, ("profiles", target, "disaggregation"))
    elif target == "auto" or target in cfg.models or unconfigured_model(target):
        model_name = cfg.default_model if target == "auto" else target
        # A profile written for exactly this hardware and model carries its tuned overrides: use it.
        matching = [n for n, p in cfg.profiles.items() if p.hardware == detected_hardware and p.model == model_name]
        if matching:
            return resolve_profile(cfg, sorted(matching)[0], detected_hardware)
        hw_name, description, profile_layer, profile_env, profile_slo = detected_hardware, "", [], {}, []
        profile_split = (None, ())
        target = f"{hw_name}/{model_name}"
    else:
        known = [*cfg.profiles, *cfg.models, "auto"]
        raise ConfigError(
            f"unknown profile or model {target!r}{suggest(target, known)}",
            hint=f"use one of: {', '.join(sorted(known))}, a Hugging Face Hub id (org/name) or a folder "
            "with config.json (see `vstack config validate`)",
        )
    if hw_name not in cfg.hardware:
        raise ConfigError(f"unknown hardware profile {hw_name!r}{suggest(hw_name, cfg.hardware)}")
    hardware, model = cfg.hardware[hw_name], model_entry(cfg, model_name)
    if model is None:
        raise ConfigError(f"profile {target!r} names model {model_name!r}, which is not configured"
                          f"{suggest(model_name, cfg.models)}", hint="add it to configs/models")
    if model.description == AD_HOC:
        target = f"{hw_name}/{model.name}"
    layers.append((("hardware", hw_name, "engine"), hardware.engine))
    layers.append((("models", model_name, "engine"), model.engine))
    layers.extend(profile_layer)
    layers.append((("engine",), cfg.engine))

    engine: dict[str, Any] = {}
    origins: dict[str, str] = {}
    generation = model.sampling.as_generation_config()
    if generation and model_name in cfg.models:
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
    own_split = (model.disaggregation, ("models", model_name, "disaggregation"))
    split, path = profile_split if profile_split[0] is not None else own_split
    where = f"{cfg.where(*path)}: {'.'.join(path)}" if split is not None else ""
    return ResolvedProfile(target, description, hardware, model, engine, origins, env, list(profile_slo or model.slo),
                           split, where)  # fmt: skip
