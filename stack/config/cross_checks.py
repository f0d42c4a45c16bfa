"""Checks across sections, run when the configuration loads: names the gateway routes to exist somewhere,
parallelism fits the GPUs a profile's hardware has, cloud providers are ones LiteLLM knows."""

from __future__ import annotations

from typing import Any

from stack.config.origins import Origins, suggest
from stack.config.resolve import resolve_profile


def _where(origins: Origins, path: tuple[str, ...]) -> str:
    return f"{origins.where(path)}: {'.'.join(path)}"


def check_gateway_names(cfg: Any, origins: Origins) -> list[str]:
    """Fallbacks and aliases must point at a model some engine or cloud deployment serves."""
    gw = cfg.gateway
    served = {m.api_name for m in cfg.models.values()} | set(cfg.models) | {c.model_name for c in gw.cloud}
    known = served | set(gw.aliases) | {"default"}
    problems = []

    def check(path: tuple[str, ...], name: str) -> None:
        if name not in known:
            problems.append(f"{_where(origins, path)}: {name!r} is served by nothing{suggest(name, known)} "
                            "(a model entry, a gateway.cloud model_name or an alias)")

    for section in ("fallbacks", "context_window_fallbacks"):
        for group, targets in getattr(gw, section).items():
            check(("gateway", section, group), group)
            for i, target in enumerate(targets):
                check(("gateway", section, group, str(i)), target)
    for alias, target in gw.aliases.items():
        check(("gateway", "aliases", alias), target)
    return problems + check_shadowing(cfg, origins)


def check_shadowing(cfg: Any, origins: Origins) -> list[str]:
    """No name may take another's traffic: an alias named like a model (or `default`, which the gateway owns),
    an adapter named like a model, an alias or another model's adapter."""
    gw = cfg.gateway
    models = {m.api_name for m in cfg.models.values()} | set(cfg.models) | {c.model_name for c in gw.cloud}
    problems = []
    for alias in gw.aliases:
        if alias == "default":
            problems.append(f"{_where(origins, ('gateway', 'aliases', alias))}: `default` is the gateway's own "
                            "alias (default_model); set default_model instead")
        elif alias in models:
            problems.append(f"{_where(origins, ('gateway', 'aliases', alias))}: alias {alias!r} is a model's name; "
                            "it would take that model's traffic: rename the alias")
    owner: dict[str, str] = {}
    for key, model in cfg.models.items():
        for i, adapter in enumerate(model.adapters):
            where = _where(origins, ("models", key, "adapters", str(i), "name"))
            if adapter.name in models or adapter.name in gw.aliases or adapter.name == "default":
                problems.append(f"{where}: adapter {adapter.name!r} is named like a model or alias; it would take "
                                "that name's traffic: rename the adapter")
            elif adapter.name in owner and owner[adapter.name] != key:
                problems.append(f"{where}: adapter {adapter.name!r} is also one of model {owner[adapter.name]!r}")
            owner.setdefault(adapter.name, key)
    return problems


def check_cloud_providers(cfg: Any, origins: Origins) -> list[str]:
    if not cfg.gateway.cloud:
        return []  # LiteLLM takes seconds to import: only when there is something to check
    from stack.config.litellm_providers import provider_problem

    problems = []
    for i, entry in enumerate(cfg.gateway.cloud):
        problem = provider_problem(entry.litellm_params)
        if problem:
            problems.append(f"{_where(origins, ('gateway', 'cloud', str(i), 'litellm_params', 'model'))}: {problem}")
    return problems


def check_parallel_fits_hardware(cfg: Any) -> list[str]:
    """tensor x pipeline x data parallel size of each GPU profile must not exceed its hardware's GPU count: each
    data-parallel rank is a whole copy of the model on tensor x pipeline parallel GPUs of its own."""
    problems = []
    for name, prof in cfg.profiles.items():
        hw = cfg.hardware.get(prof.hardware)
        if hw is None or hw.accelerator != "gpu" or prof.model not in cfg.models:
            continue
        resolved = resolve_profile(cfg, name, prof.hardware)
        tp = resolved.engine.get("tensor_parallel_size", 1)
        pp = resolved.engine.get("pipeline_parallel_size", 1)
        dp = resolved.engine.get("data_parallel_size") or 1
        if not all(isinstance(v, int) for v in (tp, pp, dp)) or tp * pp * dp <= hw.gpu_count:
            continue
        if dp > 1 and tp * pp <= hw.gpu_count:  # the data-parallel ranks are what does not fit
            origin = resolved.engine_origins.get("data_parallel_size")
            problems.append(f"{origin}: data_parallel_size {dp} x tensor_parallel_size {tp} x pipeline_parallel_size "
                            f"{pp} needs {tp * pp * dp} GPUs; hardware {hw.name!r} has {hw.gpu_count} (profiles.{name}"
                            f"): set data_parallel_size to {hw.gpu_count // (tp * pp)} or less")  # fmt: skip
            continue
        origin = resolved.engine_origins.get("tensor_parallel_size" if tp > 1 else "pipeline_parallel_size")
        problems.append(f"{origin}: tensor_parallel_size {tp} x pipeline_parallel_size {pp} needs {tp * pp} "
                        f"GPUs; hardware {hw.name!r} has {hw.gpu_count} (profiles.{name})")
    return problems
