"""Which models a load test sends to, decided and checked before the first request: a load test through a
gateway with cloud deployments (or cloud fallbacks) spends money, so it must be asked for (--allow-cloud).

The mix is --model, else the scenario's `models:`, else the first model listed that serves the scenario's route
locally (stack.load.model_choice: never an embedding model). Each model must be listed by /v1/models;
/admin/models tells its task and whether a cloud provider may serve it (its deployments, its fallbacks). A
bare vLLM engine has no /admin (404): local by construction, its one model the target."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import httpx

from stack.config.origins import suggest
from stack.load.locust_run import LoadTestError
from stack.load.model_choice import ModelFacts, model_facts, pick, refusal_hint, why_not
from stack.load.scenario import Scenario
from stack.manager.client import admin_headers


@dataclass
class LoadTarget:
    base_url: str
    models: dict[str, float]  # model -> weight
    served_by: dict[str, list[str]] = field(default_factory=dict)  # model -> "local engine-x" / "cloud openai/..."
    cloud: list[str] = field(default_factory=list)  # why a cloud provider may be reached, one line each
    unlisted: list[str] = field(default_factory=list)  # in the scenario's mix, not listed by the endpoint
    picked: str = ""  # with neither --model nor a scenario mix: which model was picked, and why

    def describe(self) -> str:
        parts = [f"{m} ({', '.join(self.served_by.get(m, [])) or 'an engine'})" for m in self.models]
        return f"{self.base_url}: " + "; ".join(parts) + (f"\n  {self.picked}" if self.picked else "")


def _headers(env: str | None) -> dict[str, str]:
    key = os.environ.get(env or "", "")
    return {"Authorization": f"Bearer {key}"} if key else {}


def decide_target(base_url: str, scenario: Scenario, model: str | None, allow_cloud: bool) -> LoadTarget:
    """The models the load test will send to and what serves each; LoadTestError, before any request, when
    --model names one that is not served there, or that cannot take the scenario's requests (an embedding
    model), or that a cloud provider may serve without --allow-cloud; and when no model fits at all."""
    try:
        listed_reply = httpx.get(f"{base_url}/v1/models", headers=_headers(scenario.target.api_key_env), timeout=10)
        listed_reply.raise_for_status()
        listed = [m["id"] for m in listed_reply.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise LoadTestError(
            f"{base_url}/v1/models did not list the models: {type(exc).__name__}",
            hint="is it up (`vstack status`)? with keys on, set VSTACK_API_KEY",
        ) from None
    if model and model not in listed:  # a scenario's own mix may name failing models on purpose
        raise LoadTestError(
            f"--model {model!r} is not served at {base_url}{suggest(model, listed)}",
            hint=f"--model one of: {', '.join(listed) or '(none)'}",
        )
    try:
        reply = httpx.get(f"{base_url}/admin/models", headers=admin_headers(base_url), timeout=10)
    except httpx.HTTPError:
        reply = None
    groups = reply.json().get("models", []) if reply is not None and reply.status_code == 200 else None
    facts = model_facts(groups) if groups is not None else {}
    picked = ""
    if model:
        mix = {model: 1.0}
        if model in facts and (why := why_not(facts[model], allow_cloud)):
            raise LoadTestError(
                f"--model {model}: {why}", hint=refusal_hint(model, facts[model], listed, facts, allow_cloud)
            )
    elif scenario.models:
        mix = dict(scenario.models)
    elif groups is not None:
        chosen, picked = pick(listed, facts, allow_cloud)
        if chosen is None:
            raise LoadTestError(
                f"{base_url}: {picked}",
                hint="name a chat model with --model (`vstack models add "
                "NAME` configures one), or pass --allow-cloud to send to a cloud model",
            )
        mix = {chosen: 1.0}
    else:  # a bare vLLM engine (no /admin: one model, served here) or a gateway that would not say
        mix = {listed[0]: 1.0} if listed else {}
    target = LoadTarget(base_url, mix, picked=picked)
    target.unlisted = [m for m in mix if m not in listed]
    if reply is not None and reply.status_code == 404:
        target.served_by = {m: ["local engine"] for m in mix}  # a bare vLLM engine: no gateway, no cloud
    elif groups is None:
        if not allow_cloud:
            raise LoadTestError(
                f"cannot tell whether {', '.join(mix)} may be served by a cloud provider "
                f"({base_url}/admin/models answered {reply.status_code if reply else 'nothing'})",
                hint="set VSTACK_ADMIN_KEY so that the gateway says, or pass --allow-cloud",
            )
    else:
        _what_serves(target, groups, facts)
    if target.cloud and not allow_cloud:  # a scenario's own mix
        raise LoadTestError(
            "this load test may reach a cloud provider (and spend money): " + "; ".join(target.cloud),
            hint="name a local model with --model, or pass --allow-cloud to send to it anyway",
        )
    return target


def _what_serves(target: LoadTarget, groups: list[dict], facts: dict[str, ModelFacts]) -> None:
    by_name = {g["model"]: g for g in groups}
    for g in groups:
        for alias in g.get("aliases", []):
            by_name.setdefault(alias, g)
    for name in target.models:
        group = by_name.get(name)
        if group is None:
            continue
        deps = group.get("deployments", [])
        target.served_by[name] = [f"{d.get('kind', 'local')} {d.get('provider_model') or d['id']}" for d in deps]
        target.cloud += facts[name].cloud
