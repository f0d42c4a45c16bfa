"""Which models a load test sends to, decided and checked before the first request: a load test through a
gateway with cloud deployments (or cloud fallbacks) spends money, so it must be asked for (--allow-cloud).

The mix is --model, else the scenario's `models:`, else the first model the endpoint lists. Each model must be
listed by /v1/models; /admin/models tells whether a cloud provider may serve it (its deployments, its
fallbacks). A bare vLLM engine has no /admin (404): local by construction."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import httpx

from stack.config.origins import suggest
from stack.load.locust_run import LoadTestError
from stack.load.scenario import Scenario
from stack.manager.client import admin_headers


@dataclass
class LoadTarget:
    base_url: str
    models: dict[str, float]  # model -> weight
    served_by: dict[str, list[str]] = field(default_factory=dict)  # model -> "local engine-x" / "cloud openai/..."
    cloud: list[str] = field(default_factory=list)  # why a cloud provider may be reached, one line each
    unlisted: list[str] = field(default_factory=list)  # in the scenario's mix, not listed by the endpoint

    def describe(self) -> str:
        parts = [f"{m} ({', '.join(self.served_by.get(m, [])) or 'an engine'})" for m in self.models]
        return f"{self.base_url}: " + "; ".join(parts)


def _headers(env: str | None) -> dict[str, str]:
    key = os.environ.get(env or "", "")
    return {"Authorization": f"Bearer {key}"} if key else {}


def decide_target(base_url: str, scenario: Scenario, model: str | None, allow_cloud: bool) -> LoadTarget:
    """The models the load test will send to and what serves each; LoadTestError when one is not served
    there, or when a cloud provider may be reached and --allow-cloud was not given."""
    try:
        listed_reply = httpx.get(f"{base_url}/v1/models", headers=_headers(scenario.target.api_key_env), timeout=10)
        listed_reply.raise_for_status()
        listed = [m["id"] for m in listed_reply.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise LoadTestError(f"{base_url}/v1/models did not list the models: {type(exc).__name__}",
                            hint="is it up (`vstack status`)? with keys on, set VSTACK_API_KEY") from None
    mix = {model: 1.0} if model else dict(scenario.models) or ({listed[0]: 1.0} if listed else {})
    if model and model not in listed:  # a scenario's own mix may name failing models on purpose
        raise LoadTestError(f"{model!r} is not served at {base_url}{suggest(model, listed)}",
                            hint=f"--model one of: {', '.join(listed) or '(none)'}")
    target = LoadTarget(base_url, mix)
    target.unlisted = [m for m in mix if m not in listed]
    try:
        reply = httpx.get(f"{base_url}/admin/models", headers=admin_headers(base_url), timeout=10)
    except httpx.HTTPError:
        reply = None
    if reply is not None and reply.status_code == 404:
        target.served_by = {m: ["local engine"] for m in mix}  # a bare vLLM engine: no gateway, no cloud
    elif reply is None or reply.status_code != 200:
        if not allow_cloud:
            raise LoadTestError(f"cannot tell whether {', '.join(mix)} may be served by a cloud provider "
                                f"({base_url}/admin/models answered {reply.status_code if reply else 'nothing'})",
                                hint="set VSTACK_ADMIN_KEY so that the gateway says, or pass --allow-cloud")
    else:
        _what_serves(target, reply.json().get("models", []))
    if target.cloud and not allow_cloud:
        raise LoadTestError("this load test may reach a cloud provider (and spend money): " + "; ".join(target.cloud),
                            hint="name a local model with --model, or pass --allow-cloud to send to it anyway")
    return target


def _what_serves(target: LoadTarget, groups: list[dict]) -> None:
    by_name = {g["model"]: g for g in groups}
    for g in groups:
        for alias in g.get("aliases", []):
            by_name.setdefault(alias, g)

    def cloud_of(group: dict) -> list[str]:
        return [d.get("provider_model") or d["id"] for d in group.get("deployments", []) if d.get("kind") == "cloud"]

    for name in target.models:
        group = by_name.get(name)
        if group is None:
            continue
        deps = group.get("deployments", [])
        target.served_by[name] = [f"{d.get('kind', 'local')} {d.get('provider_model') or d['id']}" for d in deps]
        if cloud_of(group):
            target.cloud.append(f"{name} is served by {', '.join(cloud_of(group))}")
        for fallback in [*group.get("fallbacks", []), *group.get("context_window_fallbacks", [])]:
            other = by_name.get(fallback)
            if other is not None and cloud_of(other):
                target.cloud.append(f"{name} falls back to {fallback} ({', '.join(cloud_of(other))})")
