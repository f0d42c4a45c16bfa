"""The model-specific engine options decided at plan time: task (generate/embed), family facts (tool and
reasoning parsers, chat template) and LoRA (adapters, limits). Each lands in the resolved engine options
with its origin, so `vstack config render` shows where it came from; explicit engine options win."""

from __future__ import annotations

from pathlib import Path

from stack.config.resolve import ResolvedProfile
from stack.config.schema import StackConfig
from stack.errors import ConfigError
from stack.vllm.families import Registered, check_parsers, registered_parsers, serving_options
from stack.vllm.lora import (
    RUNTIME_ENV,
    AdapterError,
    AdapterInfo,
    adapter_dir,
    check_fits,
    check_weights,
    engine_options,
    inspect,
)
from stack.vllm.options import VllmCatalog

LOOK_UP = "look up"  # parsers not handed in: read from `python`'s vLLM (registered_parsers)


def apply_model_serving(cfg: StackConfig, resolved: ResolvedProfile, model_dir: Path | None, python: str,
                        notes: list[str], fetch_adapters: bool = False, catalog: VllmCatalog | None = None,
                        parsers: Registered | str | None = LOOK_UP) -> list[AdapterInfo]:  # fmt: skip
    """Fill the resolved engine options; returns the adapters found (those not on this machine yet are
    left out at plan time unless fetch_adapters). parsers: the installed vLLM's registered tool and
    reasoning parsers, as the caller read them once (None: no vLLM to ask)."""
    model, engine, origins = resolved.model, resolved.engine, resolved.engine_origins
    where = cfg.where("models", model.name)
    if model.task == "embed" and "runner" not in engine:
        engine["runner"], origins["runner"] = "pooling", f"{where}: models.{model.name}.task embed"
    known = (lambda key: key in catalog) if catalog is not None else (lambda _: True)
    options, option_origins, family_notes = serving_options(model, model_dir, engine, where, known)
    engine.update(options)
    origins.update(option_origins)
    notes.extend(family_notes)
    check_parsers(model, engine, registered_parsers(python) if parsers == LOOK_UP else parsers, where)  # type: ignore[arg-type]
    infos = adapters_of(cfg, resolved, model_dir, fetch_adapters, notes)
    lora, lora_origins = engine_options(model, infos or _declared(resolved), engine,
                                        resolved.hardware.accelerator)
    engine.update(lora)
    origins.update(lora_origins)
    if engine.get("enable_lora") and model.lora.runtime_updates:
        resolved.env.setdefault(RUNTIME_ENV, "True")
    return infos


def _declared(resolved: ResolvedProfile) -> list[AdapterInfo]:
    # Adapters not fetched yet still turn LoRA on (rank 8 assumed until their files are read).
    return [AdapterInfo(a.name, Path(a.path or ""), 8, (), None) for a in resolved.model.adapters]


def adapters_of(cfg: StackConfig, resolved: ResolvedProfile, model_dir: Path | None, fetch: bool,
                notes: list[str]) -> list[AdapterInfo]:
    model = resolved.model
    infos: list[AdapterInfo] = []
    problems: list[str] = []
    for entry in model.adapters:
        if entry.hub and not fetch:
            continue
        try:
            info = inspect(entry, adapter_dir(entry, cfg.cache_dir))
            check_fits(info, model, model.lora.max_lora_rank or resolved.engine.get("max_lora_rank"), model_dir)
            check_weights(entry.name, info.path)  # NaN/Inf or absurd weights: refused before any engine loads them
        except AdapterError as exc:
            problems.append(f"models.{model.name}.adapters: {exc.message} ({cfg.where('models', model.name)})")
            continue
        infos.append(info)
        notes.append(f"adapter: {info.name} (rank {info.rank}, {', '.join(info.target_modules) or 'all'}) "
                     f"from {info.path}")
    if problems:
        raise ConfigError(problems, hint="fix or remove the adapter; the base model serves without it")
    return infos
