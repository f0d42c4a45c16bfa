"""Engine options -> the exact `vllm serve` arguments for a given vLLM, checked against its own parser.

Explicit CLI arguments, never `vllm serve --config file.yaml`: that route silently drops `false` values,
ignores `--config=x.yaml` and takes one file only (docs/design/vllm-notes.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from packaging.version import Version

from stack.config.origins import suggest
from stack.config.redact import option_is_secret
from stack.errors import ConfigError
from stack.vllm.options import JSON_TYPES, VllmCatalog, VllmOption

MIGRATIONS_FILE = Path(__file__).with_name("migrations.yaml")
# Set by the stack itself from the profile and the stack settings, so a profile must not set them.
RESERVED = {
    "model": "the model comes from the profile's `model:` entry (its source)",
    "model_tag": "the model comes from the profile's `model:` entry (its source)",
    "host": "engines always bind to loopback; set `host` in stack.yaml",
    "port": "set `port` in stack.yaml (or --port); 0 picks a free port",
    "served_model_name": "set `served_name` on the model entry",
    "config": "write the options themselves; the stack renders them as explicit arguments",
}
INT_TYPES = {"int"}
FLOAT_TYPES = {"float"}
HUMAN_INT_TYPES = {"human_readable_int", "human_readable_int_or_auto"}


@cache
def _migrations() -> dict[str, Any]:
    return yaml.safe_load(MIGRATIONS_FILE.read_text())


@dataclass
class RenderedArgs:
    args: list[str]
    warnings: list[str] = field(default_factory=list)
    secret_values: set[str] = field(default_factory=set)

    def redacted(self) -> list[str]:
        return ["***" if a in self.secret_values else a for a in self.args]


def _set_path(options: dict[str, Any], dotted: str, value: Any) -> None:
    head, _, rest = dotted.partition(".")
    if not rest:
        options[head] = value
        return
    nested = options.get(head)
    options[head] = {**(nested if isinstance(nested, dict) else {}), **_nested(rest, value)}


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    head, _, rest = dotted.partition(".")
    return {head: _nested(rest, value) if rest else value}


def migrate(
    options: dict[str, Any], catalog: VllmCatalog, origins: dict[str, str]
) -> tuple[dict[str, Any], list[str], list[str]]:
    """(migrated options, warnings, problems) for options vLLM removed or changed."""
    table = _migrations()
    out: dict[str, Any] = {}
    warnings: list[str] = []
    problems: list[str] = []
    for key, value in options.items():
        rule = table["options"].get(key)
        where = origins.get(key, f"engine.{key}")
        if rule is None or key in catalog:
            if rule and "warn" in rule and key in catalog:
                warnings.append(f"{where}: {rule['warn']}")
            out[key] = value
            continue
        if "warn" in rule:
            warnings.append(f"{where}: {rule['warn']}")
            continue
        if "to" not in rule:
            instead = f"; {rule['instead']}" if rule.get("instead") else ""
            problems.append(f"{where}: `{key}` is not an option of vLLM {catalog.version}: {rule['reason']}{instead}")
            continue
        new_value = rule.get("values", {}).get(value, value) if "values" in rule else value
        warnings.append(
            f"{where}: `{key}` was removed from vLLM ({rule['reason']}); using `{rule['to']}: "
            f"{json.dumps(new_value)}` instead. Update your config to silence this."
        )
        if new_value is not None:
            _set_path(out, rule["to"], new_value)
    for key, by_value in table["values"].items():
        value = out.get(key)
        rule = by_value.get(value) if isinstance(value, str) else None
        if rule is None or catalog.parsed_version <= Version(rule["removed_after"]):
            continue
        where = origins.get(key, f"engine.{key}")
        if "to" in rule:
            del out[key]
            for new_key, new_value in rule["to"].items():
                out.setdefault(new_key, new_value)
            warnings.append(f"{where}: `{key}: {value}`: {rule['reason']}; using {rule['to']} instead")
        else:
            problems.append(f"{where}: `{key}: {value}`: {rule['reason']}; {rule['instead']}")
    return out, warnings, problems


def _check_scalar(opt: VllmOption, value: Any) -> str | None:
    if isinstance(value, dict | list) and opt.type not in (*JSON_TYPES, "_optional_type", None):
        return f"expects a single {opt.type or 'value'}, got a {type(value).__name__}"
    if opt.type in INT_TYPES and (isinstance(value, bool) or not isinstance(value, int)):
        return f"expects an integer, got {value!r}"
    if opt.type in FLOAT_TYPES and (isinstance(value, bool) or not isinstance(value, int | float)):
        return f"expects a number, got {value!r}"
    if opt.type in HUMAN_INT_TYPES and not isinstance(value, int | str):
        return f"expects an integer or a size like '32k', got {value!r}"
    if opt.choices is not None and str(value) not in opt.choices:
        return f"must be one of {', '.join(opt.choices)}; got {value!r}{suggest(str(value), opt.choices)}"
    return None


def _scalar_text(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _render_one(opt: VllmOption, value: Any) -> tuple[list[str], str | None]:
    """(argv fragment, problem) for one option."""
    kind = opt.kind
    if kind in ("switch", "flag"):
        if not isinstance(value, bool):
            return [], f"expects true or false, got {value!r}"
        if value:
            return [opt.flag], None
        if kind == "switch" and opt.negative_flag:
            return [opt.negative_flag], None  # an explicit false reaches vLLM (its default may be true)
        if opt.default in (False, None):
            return [], None  # store_true: absent is false
        return [], "cannot be set to false in this vLLM version"
    if kind in ("list", "append"):
        items = value if isinstance(value, list) else [value]
        if opt.nargs == "+" and not items:
            return [], "needs at least one value"
        for item in items:
            problem = _check_scalar(opt, item)
            if problem:
                return [], problem
        texts = [_scalar_text(item) for item in items]
        if kind == "append":
            return [part for text in texts for part in (opt.flag, text)], None
        return [opt.flag, *texts], None
    problem = _check_scalar(opt, value)
    return ([], problem) if problem else ([opt.flag, _scalar_text(value)], None)


def render_engine_args(
    options: dict[str, Any], catalog: VllmCatalog, origins: dict[str, str] | None = None
) -> RenderedArgs:
    """Validate every option against the catalog and render it; all problems are reported at once."""
    origins = origins or {}
    migrated, warnings, problems = migrate(options, catalog, origins)
    args: list[str] = []
    secrets: set[str] = set()
    for key, value in migrated.items():
        where = origins.get(key, f"engine.{key}")
        if key in RESERVED:
            problems.append(f"{where}: `{key}` is set by the stack: {RESERVED[key]}")
            continue
        opt = catalog.options.get(key)
        if opt is None:
            problems.append(
                f"{where}: `{key}` is not an option of {catalog.distribution} {catalog.version}"
                f"{suggest(key, catalog.options)}"
            )
            continue
        if opt.deprecated:
            warnings.append(f"{where}: `{key}` is deprecated in vLLM {catalog.version}")
        fragment, problem = _render_one(opt, value)
        if problem:
            problems.append(f"{where}: `{key}` {problem}")
            continue
        if option_is_secret(key):
            secrets.update(fragment[1:])
        args.extend(fragment)
    if problems:
        raise ConfigError(problems, hint="fix the engine options above (names are vLLM's, in snake_case)")
    return RenderedArgs(args, warnings, secrets)
