"""Which provider keys a cloud deployment added at run time may use, and where they may be sent.

A provider key may come only from an environment variable the configuration names (a `gateway.cloud`
entry's `api_key_env`, or `gateway.provider_key_envs`): a deployment added at run time cannot make the
gateway send any other variable (its own client key, say) to a host of the caller's choosing (adr/0011).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from stack.config.litellm_providers import ProviderError, destination


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
