"""Which model a load test may send to: one that serves the scenario's route (every scenario sends chat
completions: loadtests/locustfile.py), locally unless --allow-cloud. Decided from the gateway's /admin/models
before the first request, so that a load test never sends thousands of requests an embedding model or a
cloud provider answers (issue 50: the first model listed was an embedding model, every request failed).

Pure functions over the JSON of /admin/models: stack.load.target fetches it and raises what they say."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROUTE = "/v1/chat/completions"  # what every scenario's requests are (loadtests/locustfile.py)


@dataclass
class ModelFacts:
    """What the gateway says of one model name (a group or an alias of one)."""

    name: str
    task: str | None = None  # generate / embed (the model config's task), None: unknown (a cloud model)
    local: bool = False  # has a deployment on this machine's engines
    cloud: list[str] = field(default_factory=list)  # how a cloud provider may serve it, one line each


def model_facts(groups: list[dict[str, Any]]) -> dict[str, ModelFacts]:
    """name (group or alias) -> its facts, from /admin/models' `models`."""
    by_name = {g["model"]: g for g in groups}
    for g in groups:
        for alias in g.get("aliases", []):
            by_name.setdefault(alias, g)

    def cloud_of(group: dict[str, Any]) -> list[str]:
        return [d.get("provider_model") or d["id"] for d in group.get("deployments", []) if d.get("kind") == "cloud"]

    out = {}
    for name, g in by_name.items():
        deps = g.get("deployments", [])
        tasks = {(d.get("labels") or {}).get("task") for d in deps if d.get("kind", "local") == "local"} - {None}
        facts = ModelFacts(name, tasks.pop() if len(tasks) == 1 else None,
                           any(d.get("kind", "local") == "local" for d in deps))  # fmt: skip
        if cloud_of(g):
            facts.cloud.append(f"{name} is served by {', '.join(cloud_of(g))}")
        for fallback in [*g.get("fallbacks", []), *g.get("context_window_fallbacks", [])]:
            other = by_name.get(fallback)
            if other is not None and cloud_of(other):
                facts.cloud.append(f"{name} falls back to {fallback} ({', '.join(cloud_of(other))})")
        out[name] = facts
    return out


def why_not(facts: ModelFacts, allow_cloud: bool) -> str | None:
    """Why a load test should not send to this model (None: it may)."""
    if facts.task == "embed":
        return (f"{facts.name} is an embedding model (task: embed): it serves /v1/embeddings, and every "
                f"scenario sends {ROUTE}")  # fmt: skip
    if facts.cloud and not allow_cloud:
        return "; ".join(facts.cloud) + ": a cloud provider may answer (and bill) its requests"
    return None


def fitting(listed: list[str], facts: dict[str, ModelFacts], allow_cloud: bool) -> list[str]:
    """The listed models a load test may send to, local engines first, in the endpoint's order."""
    ok = [m for m in listed if m in facts and why_not(facts[m], allow_cloud) is None]
    return sorted(ok, key=lambda m: not facts[m].local)


def pick(listed: list[str], facts: dict[str, ModelFacts], allow_cloud: bool) -> tuple[str | None, str]:
    """(the model to send to, the sentence that says why) or (None, why none fits)."""
    ok = fitting(listed, facts, allow_cloud)
    refused = [why for m in listed if m in facts and (why := why_not(facts[m], allow_cloud))]
    passed_over = f" ({'; '.join(refused)})" if refused else ""
    if ok:
        kind = "local chat model" if facts[ok[0]].local else "chat model"
        return ok[0], f"picked {ok[0]}: the first {kind} listed{passed_over}"
    return None, f"no model listed serves {ROUTE} locally{passed_over or ' (none listed)'}"


def refusal_hint(model: str, facts: ModelFacts, listed: list[str], all_facts: dict[str, ModelFacts],
                 allow_cloud: bool) -> str:  # fmt: skip
    """What to do instead of --model `model`."""
    others = [m for m in fitting(listed, all_facts, allow_cloud) if m != model]
    instead = f"--model {' or --model '.join(others[:3])}" if others else "a chat model (add one: `vstack models add`)"
    if facts.task == "embed":
        return f"name a chat model: {instead}, or leave --model out (the first local chat model is picked)"
    return f"pass --allow-cloud to send to it anyway (that spends money), or name a model without one: {instead}"
