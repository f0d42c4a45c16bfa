"""Serve-option changes between two vLLM versions, from dumps of `vllm serve`'s parser.

Dumps (patches/vllm-args/engine_args_<major.minor>.json) come from /work/shared/vllm-args/dump_args.py
run in each version's environment. Options our configs set are found by scanning configs/ for `engine:`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from packaging.version import Version

ARGS_DIR = Path(__file__).resolve().parents[3] / "patches" / "vllm-args"
CONFIGS_DIR = Path(__file__).resolve().parents[3] / "configs"
MIGRATIONS = Path(__file__).resolve().parents[2] / "vllm" / "migrations.yaml"


@dataclass
class OptionChange:
    option: str  # dest, e.g. max_model_len
    change: str  # removed / renamed / default / choices / flags / added
    old: Any
    new: Any
    used_by: list[str]  # config files that set it
    migration: str | None = None  # what stack/vllm/migrations.yaml does about it


def dump_for(version: str, args_dir: Path = ARGS_DIR) -> Path | None:
    v = Version(version)
    path = args_dir / f"engine_args_{v.major}.{v.minor}.json"
    return path if path.is_file() else None


def _actions(path: Path) -> dict[str, dict[str, Any]]:
    data = json.loads(path.read_text())
    return {a["dest"]: a for a in data["serve_parser_actions"] if a.get("option_strings")}


def used_options(configs: Path = CONFIGS_DIR) -> dict[str, list[str]]:
    """Engine option -> the config files that set it."""
    used: dict[str, list[str]] = {}

    def walk(node: Any, file: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "engine" and isinstance(value, dict):
                    for opt in value:
                        used.setdefault(str(opt).replace("-", "_"), []).append(file)
                walk(value, file)
        elif isinstance(node, list):
            for item in node:
                walk(item, file)

    for f in sorted(configs.rglob("*.yaml")) if configs.is_dir() else []:
        try:
            walk(yaml.safe_load(f.read_text()), str(f.relative_to(configs.parent)))
        except yaml.YAMLError:
            continue
    return used


def _migrations() -> dict[str, Any]:
    try:
        return (yaml.safe_load(MIGRATIONS.read_text()) or {}).get("options", {})
    except (OSError, yaml.YAMLError):
        return {}


def diff_options(old_dump: Path, new_dump: Path, used: dict[str, list[str]]) -> list[OptionChange]:
    old, new = _actions(old_dump), _actions(new_dump)
    by_flag = {flag: dest for dest, a in new.items() for flag in a["option_strings"]}
    migrations = _migrations()
    out: list[OptionChange] = []
    for dest, a in old.items():
        users = used.get(dest, [])
        mig = migrations.get(dest)
        note = None
        if mig:
            note = f"migrated to {mig['to']}" if mig.get("to") else mig.get("warn") or mig.get("reason")
        if dest not in new:
            moved = {by_flag[f] for f in a["option_strings"] if f in by_flag}
            if moved:
                out.append(OptionChange(dest, "renamed", dest, sorted(moved)[0], users, note))
            else:
                out.append(OptionChange(dest, "removed", a["option_strings"], None, users, note))
            continue
        b = new[dest]
        if a.get("default") != b.get("default"):
            out.append(OptionChange(dest, "default", a.get("default"), b.get("default"), users, note))
        if a.get("choices") != b.get("choices"):
            out.append(OptionChange(dest, "choices", a.get("choices"), b.get("choices"), users, note))
        if set(a["option_strings"]) - set(b["option_strings"]):
            out.append(OptionChange(dest, "flags", a["option_strings"], b["option_strings"], users, note))
    for dest in sorted(new.keys() - old.keys()):
        if not any(c.new == dest for c in out):
            out.append(OptionChange(dest, "added", None, new[dest]["option_strings"], used.get(dest, [])))
    return out
