"""Engines' own Prometheus text, read the way Prometheus reads it: the gateway's /metrics/targets (HTTP service
discovery), then each target's /metrics/engines/<id>. Both routes follow the gateway's keys (adr/0020), so a
key is sent where one is set (a client key, the admin key or gateway.metrics_key all open them)."""

from __future__ import annotations

import httpx


def _headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def engine_targets(base: str, key: str | None = None) -> list[dict]:
    """The gateway's service-discovery list; a refusal (401, 403) raises with the gateway's answer."""
    resp = httpx.get(f"{base}/metrics/targets", headers=_headers(key), timeout=10)
    resp.raise_for_status()
    return resp.json()


def engine_metrics_text(base: str, key: str | None = None) -> str:
    """Every listed engine's vllm:* text, concatenated (each target's own path, as Prometheus scrapes it)."""
    text = ""
    for target in engine_targets(base, key):
        resp = httpx.get(f"{base}{target['labels']['__metrics_path__']}", headers=_headers(key), timeout=10)
        resp.raise_for_status()
        text += resp.text
    return text


def sample_sums(text: str, names: tuple[str, ...] | list[str]) -> dict[str, float]:
    """The named samples of a Prometheus text, each summed over its label sets (0.0 where absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = dict.fromkeys(names, 0.0)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in out:
                out[s.name] += s.value
    return out
