"""`vstack models add NAME`: one command to add a model to the set the gateway may switch between
(`manager.models` in the user's config file), checked before and after the file is written."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from stack.config import load_config
from stack.config.loader import ENV_CONFIG_FILE
from stack.config.origins import suggest
from stack.config.resolve import unconfigured_model
from stack.config.schema import StackConfig
from stack.errors import ConfigError, StackError


def switchable_name(cfg: StackConfig, name: str) -> str:
    """The name as manager.models should hold it: a configured model or profile as is, a Hub id as is, a
    folder as its absolute path (it must resolve from wherever `vstack up` runs)."""
    if name in cfg.models or name in cfg.profiles:
        return name
    entry = unconfigured_model(name)
    if entry is None:
        known = [*cfg.models, *cfg.profiles]
        raise ConfigError(f"{name!r} is not a configured model or profile, a Hub id (org/name) or a folder with "
                          f"config.json{suggest(name, known)}", hint=f"one of: {', '.join(sorted(known))}")
    return entry.source.path or name


def config_file(given: Path | None) -> Path:
    """The user's config file to write: --config, else $VSTACK_CONFIG (a folder: its stack.yaml)."""
    raw = given or os.environ.get(ENV_CONFIG_FILE)
    if not raw:
        raise ConfigError("no config file to add the model to",
                          hint=f"name one with --config FILE (created if missing) or {ENV_CONFIG_FILE}; or, "
                          "without a file: export VSTACK_MANAGER__MODELS='[\"A\", \"B\"]'")
    path = Path(raw).expanduser()
    return path / "stack.yaml" if path.is_dir() else path


def add_switchable(cfg: StackConfig, name: str, given: Path | None) -> tuple[Path, list[str]]:
    """Append NAME to manager.models in the user's file; the file is restored if the result does not load."""
    entry = switchable_name(cfg, name)
    path = config_file(given)
    models = list(cfg.manager.models)
    if entry in models:
        return path, models
    models.append(entry)
    before = path.read_text() if path.is_file() else None
    data = yaml.safe_load(before or "") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a YAML mapping", hint="fix the file, then run the command again")
    if "manager" not in data:  # appended as text: the file's comments stay
        text = (before or "").rstrip("\n")
        path.write_text((text + "\n\n" if text else "") + yaml.safe_dump({"manager": {"models": models}},
                                                                          default_flow_style=None))
    else:
        section = data["manager"] or {}
        section["models"] = models
        data["manager"] = section
        path.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=None))
    try:
        load_config(path)
    except StackError:
        if before is None:
            path.unlink()
        else:
            path.write_text(before)
        raise
    return path, models
