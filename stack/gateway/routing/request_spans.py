"""A request's spans as the dispatcher opens them (adr/0042): the root's attributes after OpenTelemetry's GenAI
semantic conventions, one client span per attempt (the parent of what the engine or provider records), and what
the model manager says of the switch a request waited for."""

from __future__ import annotations

from typing import Any

from stack.gateway.endpoints import BY_NAME
from stack.gateway.routing.attempt import RoutedRequest
from stack.tracing.record import CLIENT, RequestTrace, Span, clock

# gen_ai.operation.name of each endpoint


def request_attrs(trace: RequestTrace, body: dict[str, Any], model: str, group: str) -> None:
    attrs = trace.root.attrs
    attrs["gen_ai.request.model"] = model
    attrs["vstack.model_group"] = group
    attrs["vstack.stream"] = bool(body.get("stream"))
    for key, attr in (("max_tokens", "gen_ai.request.max_tokens"), ("temperature", "gen_ai.request.temperature"),
                      ("top_p", "gen_ai.request.top_p")):  # fmt: skip
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attrs[attr] = value


def attempt_span(request: RoutedRequest, dep: Any, reason: str | None, retry: bool, n: int) -> Span:
    """One try of one deployment: a GenAI client span ("chat <model>"), the parent of the engine's spans."""
    local = dep.kind == "local"
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": BY_NAME[request.endpoint].operation or request.endpoint,
        "gen_ai.request.model": dep.upstream_model,
        "gen_ai.system": "vllm" if local else dep.upstream_model.partition("/")[0] or "cloud",
        "vstack.deployment": dep.id,
        "vstack.deployment.kind": dep.kind,
        "vstack.attempt": n,
        "vstack.retry": retry,
    }
    if reason:
        attrs["vstack.fallback_reason"] = reason
    if local and dep.api_base:
        attrs["server.address"] = dep.api_base
    return request.trace.span(
        f"{attrs['gen_ai.operation.name']} {dep.upstream_model}",  # type: ignore[union-attr]
        start=clock(),
        kind=CLIENT,
        **attrs,
    )


def switch_attrs(admission: Any, group: str, since: int) -> dict[str, Any]:
    """The switch the request waited for, when one ended while it waited: its kind, seconds and trace id (the
    switch is a trace of its own, its phases its spans: the manager's)."""
    last = getattr(admission, "last_switch", None)
    info = last(group) if callable(last) else None
    if not info or (info.get("ended_ns") or 0) < since:
        return {}
    return {f"vstack.switch.{k}": v for k, v in info.items() if k != "ended_ns"}
