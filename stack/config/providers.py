"""Which cloud deployments the gateway may call, checked before one is registered.

- The provider must be one LiteLLM knows (its own `get_llm_provider`, the function its calls go through),
  so an unknown one is refused when the configuration loads or `POST /admin/deployments` arrives, not
  with LiteLLM's traceback at the first request.
- A provider key may come only from an environment variable the configuration names (a `gateway.cloud`
  entry's `api_key_env`, or `gateway.provider_key_envs`): a deployment added at run time cannot make the
  gateway send any other variable (its own client key, say) to a host of the caller's choosing.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterable
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


class KeyPolicy:
    """Which provider-key variables a deployment added at run time may use, and where they may go.

    Fixed when the gateway starts, from its configuration, and never widened: a variable a `gateway.cloud`
    entry names may be sent only where that entry sends it (its provider and api_base); a variable listed
    in `gateway.provider_key_envs` anywhere (the operator said so); no other variable, ever.
    """

    def __init__(self, cloud: Iterable[Any], allowlist: Iterable[str]) -> None:
        self.anywhere = frozenset(allowlist)
        self.places: dict[str, set[tuple[str, str | None]]] = {}
        for entry in cloud:
            if entry.api_key_env:
                try:
                    place = destination(entry.litellm_params)
                except ProviderError:
                    continue  # refused when the configuration loaded; nothing to allow
                self.places.setdefault(entry.api_key_env, set()).add(place)

    @property
    def names(self) -> list[str]:
        return sorted(self.anywhere | set(self.places))

    def problem(self, api_key_env: str | None, litellm_params: dict[str, Any]) -> str | None:
        """None when a run-time deployment may use this key here (its provider must be valid first)."""
        if not api_key_env:
            # LiteLLM would fall back to the provider's default variable (OPENAI_API_KEY, ...): not at run time.
            return (f"a cloud deployment added at run time must name its key's variable in api_key_env "
                    f"(allowed: {', '.join(self.names) or 'none; list them in gateway.provider_key_envs'})")
        if api_key_env in self.anywhere:
            return None
        if api_key_env not in self.places:
            return (f"api_key_env {api_key_env!r} is not a provider key of this gateway (allowed: "
                    f"{', '.join(self.names) or 'none'}; the configuration's gateway.cloud entries and "
                    "gateway.provider_key_envs name them)")
        place = destination(litellm_params)
        if place not in self.places[api_key_env]:
            shown = ", ".join(f"{p} at {b or 'its default endpoint'}" for p, b in sorted(self.places[api_key_env],
                                                                                      key=str))
            return (f"api_key_env {api_key_env!r} may only be sent where the configuration sends it ({shown}), "
                    f"not to {place[0]} at {place[1] or 'its default endpoint'}")
        return None
