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

from stack.config.errors import suggest

# LiteLLM resolves `os.environ/NAME` values in params to that variable's value: a way around api_key_env.
ENV_REFERENCE = "os.environ/"


def provider_problem(litellm_params: dict[str, Any]) -> str | None:
    """None when LiteLLM can route `model` (with its api_base/custom_llm_provider), else why not."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: no cost map download
    os.environ.setdefault("LITELLM_LOG", "ERROR")
    import litellm

    model = litellm_params.get("model")
    if not isinstance(model, str) or not model:
        return "`model` must be provider/model, e.g. openai/gpt-4o-mini"
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # LiteLLM prints a provider-list banner on failure
            litellm.get_llm_provider(model=model, custom_llm_provider=litellm_params.get("custom_llm_provider"),
                                     api_base=litellm_params.get("api_base"))  # fmt: skip
    except Exception:  # LiteLLM raises its BadRequestError (with a long provider list) for an unknown one
        provider = model.split("/", 1)[0] if "/" in model else model
        providers = [str(getattr(p, "value", p)) for p in litellm.provider_list]
        return (f"LiteLLM has no provider {provider!r} for model {model!r}{suggest(provider, providers)} "
                "(write provider/model, e.g. openai/gpt-4o-mini; see docs.litellm.ai/docs/providers)")
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


def allowed_key_envs(cloud_key_envs: Iterable[str | None], allowlist: Iterable[str]) -> frozenset[str]:
    """The variables provider keys may be read from: fixed when the gateway starts, never widened."""
    return frozenset(name for name in (*cloud_key_envs, *allowlist) if name)
