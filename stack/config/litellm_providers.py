"""Cloud providers as LiteLLM sees them, checked when the configuration loads and when a deployment is
added at run time: the provider must be one LiteLLM knows (its own `get_llm_provider`, the function its
calls go through), and no parameter may ask LiteLLM to read an environment variable by itself."""

from __future__ import annotations

import contextlib
import io
import os
from typing import Any

from stack.config.origins import suggest

# LiteLLM resolves `os.environ/NAME` values in params to that variable's value: a way around api_key_env.
ENV_REFERENCE = "os.environ/"


class ProviderError(ValueError):
    """LiteLLM cannot route this model (unknown provider, missing provider/ prefix)."""


def destination(litellm_params: dict[str, Any]) -> tuple[str, str | None]:
    """(provider, api_base) LiteLLM would send a call to, by its own `get_llm_provider`; ProviderError if none."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: no cost map download
    os.environ.setdefault("LITELLM_LOG", "ERROR")
    import litellm

    model = litellm_params.get("model")
    if not isinstance(model, str) or not model:
        raise ProviderError("`model` must be provider/model, e.g. openai/gpt-4o-mini")
    base = litellm_params.get("api_base")
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # LiteLLM prints a provider-list banner on failure
            _, provider, _, dynamic_base = litellm.get_llm_provider(
                model=model, custom_llm_provider=litellm_params.get("custom_llm_provider"), api_base=base)
    except Exception:  # LiteLLM raises its BadRequestError (with a long provider list) for an unknown one
        provider = model.split("/", 1)[0] if "/" in model else model
        providers = [str(getattr(p, "value", p)) for p in litellm.provider_list]
        raise ProviderError(f"LiteLLM has no provider {provider!r} for model {model!r}"
                            f"{suggest(provider, providers)} (write provider/model, e.g. openai/gpt-4o-mini; "
                            "see docs.litellm.ai/docs/providers)") from None
    where = base or dynamic_base
    return str(provider), str(where).rstrip("/") if where else None


def provider_problem(litellm_params: dict[str, Any]) -> str | None:
    try:
        destination(litellm_params)
    except ProviderError as exc:
        return str(exc)
    return None


def env_references(params: Any, path: str = "litellm_params") -> list[str]:
    """Key paths of values that ask LiteLLM to read an environment variable (`os.environ/NAME`)."""
    if isinstance(params, str):
        return [path] if params.strip().startswith(ENV_REFERENCE) else []
    if isinstance(params, dict):
        return [p for k, v in params.items() for p in env_references(v, f"{path}.{k}")]
    if isinstance(params, list):
        return [p for i, v in enumerate(params) for p in env_references(v, f"{path}.{i}")]
    return []
