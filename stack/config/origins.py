"""Where each configuration value came from, and error messages that say so."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ValidationError

from stack.config.redact import is_secret_key

Path_ = tuple[str, ...]
# Values under keys with these words are never echoed back in an error message.
SECRET_WORDS = ("token", "key", "secret", "password")


def suggest(word: str, candidates: Iterable[str], prefix: str = "; did you mean ") -> str:
    """`; did you mean 'max_num_seqs'?` when a candidate is close enough, else ''."""
    close = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)
    return f"{prefix}{close[0]!r}?" if close else ""


class Origins:
    """Maps key paths (('models', 'qwen', 'engine', 'max_model_len')) to the place that set them."""

    def __init__(self) -> None:
        self._map: dict[Path_, str] = {}

    def set(self, path: Path_, origin: str) -> None:
        self._map[tuple(path)] = origin

    def record(self, path: Path_, value: Any, origin: str) -> None:
        self.set(path, origin)
        if isinstance(value, dict):
            for key, sub in value.items():
                self.record((*path, str(key)), sub, origin)

    def inherit(self, parent: Path_, child: Path_) -> None:
        n = len(parent)
        for path, origin in list(self._map.items()):
            if path[:n] == parent and (*child, *path[n:]) not in self._map:
                self._map[(*child, *path[n:])] = f"{origin} (inherited by {'.'.join(child)})"

    def where(self, path: Path_) -> str:
        path = tuple(str(p) for p in path)
        for end in range(len(path), 0, -1):
            if path[:end] in self._map:
                return self._map[path[:end]]
        return "defaults"


def _unwrap(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else annotation
    return annotation


def fields_at(model: type[BaseModel], loc: Path_) -> list[str]:
    """The field names a model accepts at a location (for did-you-mean on unknown keys)."""
    current: Any = model
    parts = list(loc)
    while parts:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(parts.pop(0))
            if field is None:
                return []
            current = field.annotation
        elif typing.get_origin(current) is dict:
            parts.pop(0)
            current = typing.get_args(current)[1]
        else:
            return []
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def format_validation_error(exc: ValidationError, origins: Origins, model: type[BaseModel]) -> list[str]:
    lines = []
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"])
        key = ".".join(loc) or "(top level)"
        where = origins.where(loc)
        if err["type"] == "extra_forbidden":
            allowed = fields_at(model, loc[:-1])
            hint = suggest(loc[-1], allowed, prefix=" did you mean ")
            hint = hint or (f" allowed keys: {', '.join(allowed)}" if allowed else "")
            lines.append(f"{where}: {key}: unknown key;{hint}")
        elif err["type"] == "missing":
            lines.append(f"{where}: {key}: required key is missing; add it")
        else:
            given = err.get("input")
            secret = any(word in key.lower() for word in SECRET_WORDS) or is_secret_key(model, loc)
            shown = "" if secret or isinstance(given, dict | list) else f" (got {given!r})"
            lines.append(f"{where}: {key}: {err['msg']}{shown}")
    return lines
