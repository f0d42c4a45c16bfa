"""A disaggregated model's request (adr/0052): its prompt computed on a prefill engine, its tokens on a decode one.

vLLM's own proxy flow for NixlConnector (vllm tests/v1/kv_connector/nixl_integration/toy_proxy_server.py), run
by the gateway inside the decode engine's attempt (no proxy process): the request goes first to a prefill engine
with `kv_transfer_params: {do_remote_decode: true, ...}`, `stream: false`, `max_tokens: 1` (and
`max_completion_tokens: 1` where set), without `stream_options` and the `min_tokens` the prefill side does not
take; its answer's `kv_transfer_params` (where the prompt's KV blocks wait) are added to the original request,
which the decode engine answers (streamed or not) after reading those blocks over NIXL. Both calls carry the
same X-Request-Id. Only the decode engine's answer reaches the client and is counted (usage, metrics,
Activity): the prefill answer's one token is dropped.

When things go wrong:
- no prefill engine is ready (all lost or starting): the decode engine computes the prompt itself (its
  kv_both connector serves a request without kv_transfer_params as an aggregated engine does); logged, and the
  answer's `x-vstack-prefill` header says `none ready`;
- a prefill engine fails (unreachable, 5xx, timeout): the next ready prefill engine is tried; when none is
  left, the client gets 502 naming the prefill engine and why: decoding without the prompt's KV would only
  hide a broken prefill tier behind slower answers (vLLM's proxy fails the request too);
- a prefill engine refuses the request (4xx, a prompt too long): its answer goes to the client as any
  engine's refusal does (the decode engine would refuse it alike);
- a prefill answer without kv_transfer_params (an engine without the connector): the decode engine runs the
  whole request; logged.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import orjson

from stack.gateway.openai_errors import UpstreamError

log = logging.getLogger("stack.gateway.disaggregated")
PHASE = "phase"  # the deployment label of a disaggregated model's engine: prefill or decode
HEADER = "x-vstack-prefill"
# What vLLM's prefill side is asked: compute the prompt, keep its KV blocks for a remote decode.
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip


def is_decode(dep: Any) -> bool:
    return dep.labels.get(PHASE) == "decode"


def prefill_body(out: dict[str, Any]) -> dict[str, Any]:
    """The decode request's body as the prefill engine is sent it (vLLM's proxy flow)."""
    body = {k: v for k, v in out.items() if k not in ("stream_options", "min_tokens", "min_completion_tokens")}
    body.update(kv_transfer_params=dict(PREFILL_PARAMS), stream=False, max_tokens=1)
    if "max_completion_tokens" in out:
        body["max_completion_tokens"] = 1
    return body


def kv_params_of(raw: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    params = obj.get("kv_transfer_params") if isinstance(obj, dict) else None
    return params if isinstance(params, dict) and params else None


async def prefill_first(gw: Any, at: Any, path: str, out: dict[str, Any]) -> dict[str, Any]:
    """The body for the decode engine `at.dep`: `out` with the prefill answer's kv_transfer_params. `gw`: the
    dispatcher (routing, local upstream, metrics); sets `at.request_id` for both calls and `at.extra_headers`."""
    at.request_id = str(uuid.uuid4())
    tried: list[str] = []
    last: UpstreamError | None = None
    while (dep := gw.routing.prefill_for(at.dep, set(tried))) is not None:
        tried.append(dep.id)
        span = at.request.trace.span("gateway.prefill", parent=at.span) if at.span is not None else None
        gw.routing.replicas.begin(dep.id)  # the least outstanding choice among prefill engines counts it
        try:
            at.engine_called(time.perf_counter())  # the prefill engine's call is the request's first
            resp = await gw.local.open(dep, path, orjson.dumps(prefill_body(out)), request_id=at.request_id)
            raw = await gw.local.read(resp, dep)
        except UpstreamError as err:
            if span is not None:
                span.close(error=err.reason, **{"vstack.deployment": dep.id})
            gw.metrics.upstream_errors.labels(dep.id, err.reason).inc()
            if not err.retryable:  # the request's own fault: the client hears it as from any engine
                at.extra_headers[HEADER] = dep.id
                raise
            gw.routing.report_failure(dep, err.status)
            log.warning("prefill engine %s failed for request %s: %s", dep.id, at.request_id, err.message)
            last = err
            continue
        finally:
            gw.routing.replicas.end(dep.id)
        if span is not None:
            span.close(**{"vstack.deployment": dep.id})
        at.extra_headers[HEADER] = dep.id
        params = kv_params_of(raw)
        if params is None:
            log.warning("prefill engine %s answered request %s without kv_transfer_params (is its engine started "
                        "with --kv-transfer-config?): %s computes the whole prompt", dep.id, at.request_id,
                        at.dep.id)  # fmt: skip
            at.extra_headers[HEADER] = f"{dep.id} (no kv_transfer_params: decoded whole)"
            return out
        return {**out, "kv_transfer_params": params}
    if last is not None:
        raise UpstreamError(f"prefill engine {tried[-1]} failed ({last.message}); the request was not sent to a "
                            f"decode engine; tried: {', '.join(tried)}", status=502, retryable=False,
                            reason="prefill")  # fmt: skip
    log.warning("no prefill engine of %s is ready: %s computes the prompt of request %s itself",
                at.dep.model_group, at.dep.id, at.request_id)  # fmt: skip
    at.extra_headers[HEADER] = "none ready"
    return out
