"""The request models of the installed vLLM's HTTP API: each endpoint's fields, their defaults and JSON schema.

Read by a child process of the engine's Python (stack.vllm.introspect `protocol`, as the serve options are),
cached per distribution and version next to the option catalogue. The gateway forwards a local engine's
request body as sent and lets vLLM check it (adr/0047); this catalogue is what says, from vLLM itself, which
fields that is: for the tests that prove every one passes, and for anyone asking what a version accepts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stack.files import replace_file
from stack.vllm.options import Waiting, _quiet, _run_introspect, installed_version


@dataclass(frozen=True)
class ProtocolCatalog:
    distribution: str
    version: str
    endpoints: dict[str, Any]  # endpoint -> {"models", "fields": {name: {required, default, alias}}, "schema"}
    missing: dict[str, str]  # endpoint -> why its model was not found in this version

    def fields(self, endpoint: str) -> dict[str, dict[str, Any]]:
        """The fields vLLM's request model of `endpoint` declares; empty when this version has none."""
        return self.endpoints.get(endpoint, {}).get("fields", {})

    @classmethod
    def from_dump(cls, data: dict[str, Any]) -> ProtocolCatalog:
        return cls(data["distribution"], data["vllm_version"], data["endpoints"], data.get("missing", {}))


def installed_protocol(python: str, cache_dir: Path, waiting: Waiting | None = None) -> ProtocolCatalog:
    """The request models of the vLLM in `python`, cached per distribution and version."""
    dist, version = installed_version(python)
    cache = cache_dir / "vllm-protocol" / f"{dist}-{version}.json"
    if cache.is_file():
        try:
            return ProtocolCatalog.from_dump(json.loads(cache.read_text()))
        except (ValueError, KeyError):
            cache.unlink()  # a broken cache file is rebuilt, never trusted
    with (waiting or _quiet)(f"reading the request models of {dist} {version} (once per vLLM version: a child "
                             f"process imports vLLM; cached in {cache.parent})"):  # fmt: skip
        data = _run_introspect(python, "protocol")
    replace_file(cache, json.dumps(data))
    return ProtocolCatalog.from_dump(data)
