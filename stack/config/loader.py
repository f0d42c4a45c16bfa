"""Load the configuration: built-in configs/ < the user's file < VSTACK_* environment < CLI options.

Loading (YAML files, `extends:`), layering (pydantic-settings sources) and validation (pydantic, then
cross-references) are kept apart. Every error names where the value came from (a file, an environment
variable, the command line), the key path, and a fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from stack.config.cross_checks import check_cloud_providers, check_gateway_names, check_parallel_fits_hardware
from stack.config.engine_values import check_engine_values
from stack.config.origins import Origins, format_validation_error, suggest
from stack.config.resolve import unconfigured_model
from stack.config.schema import StackConfig
from stack.counts import COUNT_ENV, count
from stack.errors import ConfigError
from stack.files import PACKAGE_DIR, shipped_folder

SECTIONS = ("hardware", "models", "profiles")
ENV_PREFIX = "VSTACK_"
ENV_CONFIG_FILE = "VSTACK_CONFIG"
ENV_CONFIG_DIR = "VSTACK_CONFIG_DIR"
# VSTACK_* variables that are not settings fields (read elsewhere on purpose).
ENV_NOT_SETTINGS = {ENV_CONFIG_FILE, ENV_CONFIG_DIR, "VSTACK_FORCE_CPU", "VSTACK_RUNTIME_PATCHES",
                    "VSTACK_DISABLE_PATCHES", "VSTACK_VENV", COUNT_ENV, "VSTACK_PLAN_SECRETS",
                    "VSTACK_ENGINE_ZYGOTE"}  # the test suite's (stack.engine.zygote)


def builtin_config_dir() -> Path:
    """configs/ of a source checkout, else the copy packaged inside the wheel."""
    env = os.environ.get(ENV_CONFIG_DIR)
    if env:
        return Path(env)
    found = shipped_folder("configs", "stack.yaml")
    if found is not None:
        return found
    raise ConfigError(
        f"no built-in configs/ found next to {PACKAGE_DIR} (nor {PACKAGE_DIR / '_configs'})",
        hint=f"reinstall vllm-stack, or point {ENV_CONFIG_DIR} at a folder with stack.yaml",
    )


class UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping: YAML keeps the last and drops the first
    silently, so a second `gateway:` section would drop the first one's api_keys (issue 34)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:  # type: ignore[override]
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` merges: its keys may be overridden on purpose
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line)
            except TypeError:
                continue  # an unhashable key: SafeLoader refuses it itself
            if first != key_node.start_mark.line:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"duplicate key {key!r} (first on line {first + 1}); YAML would silently keep only this one",
                    key_node.start_mark)  # fmt: skip
        return super().construct_mapping(node, deep)


def read_yaml(source: Path | str, *, label: str | None = None) -> Any:
    """Parse YAML from a file (Path) or inline text (str); syntax errors and duplicate keys name the file and
    line."""
    name = label or (str(source) if isinstance(source, Path) else "<inline>")
    try:
        text = source.read_text(encoding="utf-8") if isinstance(source, Path) else source
        return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except FileNotFoundError as exc:
        raise ConfigError(f"{name}: file not found", hint="check the path given to --config or VSTACK_CONFIG") from exc
    except UnicodeDecodeError as exc:
        line = source.read_bytes()[: exc.start].count(b"\n") + 1 if isinstance(source, Path) else 0
        raise ConfigError(f"{name}:{line}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})",
                          hint="save the file as UTF-8") from None
    except IsADirectoryError as exc:
        raise ConfigError(f"{name}: is a folder, not a YAML file", hint="give a file, or the folder itself") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: invalid YAML: {problem}", hint="fix the YAML syntax at that line") from exc


class ConfigLayer:
    """One layer of raw configuration with, for every key path, the place it was written."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {section: {} for section in SECTIONS}
        self.origins = Origins()

    def add_entry(self, section: str, entry: Any, origin: str, fallback_name: str | None = None) -> None:
        if not isinstance(entry, dict):
            raise ConfigError(f"{origin}: {section} entry must be a mapping, got {type(entry).__name__}")
        name = entry.get("name") or fallback_name
        if not name:
            raise ConfigError(f"{origin}: {section} entry without a name", hint="add `name: ...`")
        entry = {**entry, "name": str(name)}
        existing = self.data[section].get(name)
        self.data[section][name] = deep_merge(existing, entry) if existing else entry
        self.origins.record((section, str(name)), entry, origin)

    def add_top(self, mapping: Mapping[str, Any], origin: str) -> None:
        odd = [key for key in mapping if not isinstance(key, str)]
        if odd:
            raise ConfigError(f"{origin}: {odd[0]!r}: top-level keys are setting names (text), e.g. serve:, models:",
                              hint="quote or rename the key")
        for key, value in mapping.items():
            if key in SECTIONS:
                if not isinstance(value, dict):
                    raise ConfigError(f"{origin}: {key}: must be a mapping of name -> entry")
                for name, entry in value.items():
                    self.add_entry(key, entry if entry is not None else {}, origin, fallback_name=str(name))
            else:
                self.data[key] = deep_merge(self.data.get(key), value)
                self.origins.record((key,), value, origin)

    def add_dir(self, root: Path) -> None:
        stack_file = root / "stack.yaml"
        if stack_file.is_file():
            self.add_file(stack_file)
        for section in SECTIONS:
            for path in sorted((root / section).glob("*.y*ml")):
                shown = display_path(path)
                self.add_entry(section, read_yaml(path, label=shown) or {}, shown, fallback_name=path.stem)

    def add_file(self, path: Path) -> None:
        shown = display_path(path)
        data = read_yaml(path, label=shown)
        if data is None:
            return
        if not isinstance(data, dict):
            raise ConfigError(f"{shown}: the top level must be a mapping (serve:, models:, profiles:, ...)")
        self.add_top(data, shown)

    def add_text(self, text: str, label: str = "<inline>") -> None:
        data = read_yaml(text, label=label) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{label}: the top level must be a mapping")
        self.add_top(data, label)


def display_path(path: Path) -> str:
    """Paths under the working directory are shown relative to it: shorter, still unambiguous."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def deep_merge(base: Any, override: Any) -> Any:
    """Mappings merge key by key (the override wins); anything else is replaced whole."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = deep_merge(base.get(key), value) if key in base else value
        return merged
    return override


def resolve_extends(layer: ConfigLayer) -> None:
    """Replace each entry that says `extends: NAME` by its parent merged with itself (same section)."""
    for section in SECTIONS:
        entries = layer.data[section]
        done: dict[str, dict[str, Any]] = {}

        def resolve(name: str, chain: tuple[str, ...], entries=entries, done=done, section=section) -> dict:
            if name in done:
                return done[name]
            entry = entries[name]
            parent = entry.get("extends")
            if parent is None:
                done[name] = entry
                return entry
            where = layer.origins.where((section, name, "extends"))
            if not isinstance(parent, str):
                raise ConfigError(f"{where}: {section}.{name}.extends: must be the name of another {section} entry")
            if parent in chain or parent == name:
                cycle = " -> ".join((*chain, name, parent))
                raise ConfigError(f"{where}: {section}.{name}.extends: cycle {cycle}", hint="remove one `extends:`")
            if parent not in entries:
                raise ConfigError(
                    f"{where}: {section}.{name}.extends: unknown {section} entry {parent!r}"
                    + suggest(parent, entries),
                    hint=f"extend one of: {', '.join(sorted(entries))}",
                )
            base = resolve(parent, (*chain, name))
            child = {k: v for k, v in entry.items() if k != "extends"}
            merged = deep_merge({k: v for k, v in base.items() if k not in ("name", "description")}, child)
            layer.origins.inherit((section, parent), (section, name))
            done[name] = merged
            return merged

        for entry_name in list(entries):
            entries[entry_name] = resolve(entry_name, ())


class _LayerSource(PydanticBaseSettingsSource):
    """The merged YAML layers as a pydantic-settings source (below the environment and init values)."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


class StackSettings(BaseSettings, StackConfig):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", case_sensitive=False
    )


def _env_origins(origins: Origins) -> None:
    """Record where env values come from. A VSTACK_ variable that looks like a misspelt setting is an error;
    others are left alone (configs name VSTACK_* variables that hold keys, e.g. VSTACK_API_KEY)."""
    problems = []
    for key in os.environ:
        upper = key.upper()
        if upper.startswith(ENV_PREFIX) and upper not in ENV_NOT_SETTINGS:
            path = tuple(part.lower() for part in upper[len(ENV_PREFIX) :].split("__"))
            if path[0] in StackConfig.model_fields:
                origins.set(path, f"environment variable {key}")
                continue
            near = suggest(path[0], StackConfig.model_fields)
            if near:
                problems.append(f"environment variable {key}: {path[0]}: unknown setting{near}")
    if problems:
        raise ConfigError(problems, hint="unset the variable or fix its name (VSTACK_<SETTING>[__<KEY>...])")


def load_config(
    config: Path | str | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    text: str | None = None,
    builtin_dir: Path | None = None,
    profile_files: Sequence[Path] = (),
) -> StackConfig:
    """Load and validate the whole configuration.

    config: the user's file or folder (else $VSTACK_CONFIG); text: inline YAML (tests); overrides: values
    from the command line, highest precedence; profile_files: single profile files (as in
    configs/profiles/, named by `name:` or the file name) added on top (`vstack config validate FILE`).
    """
    count("load_config")
    layer = ConfigLayer()
    layer.add_dir(builtin_dir or builtin_config_dir())
    user = config or os.environ.get(ENV_CONFIG_FILE)
    if user:
        path = Path(user).expanduser()
        if path.is_dir():
            layer.add_dir(path)
        elif path.is_file():
            layer.add_file(path)
        else:
            source = "--config" if config else ENV_CONFIG_FILE
            raise ConfigError(f"{path}: no such file or folder (from {source})", hint="give an existing YAML file")
    if text is not None:
        layer.add_text(text)
    for path in profile_files:
        shown = display_path(path)
        layer.add_entry("profiles", read_yaml(path, label=shown) or {}, shown, fallback_name=path.stem)
    resolve_extends(layer)
    _env_origins(layer.origins)
    for key, value in (overrides or {}).items():
        layer.origins.record((key,), value, "command line")

    data = layer.data

    class _Loaded(StackSettings):
        @classmethod
        def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                       file_secret_settings):
            # CLI values > VSTACK_* environment > YAML (user file > built-in); no dotenv or secrets dir.
            return (init_settings, env_settings, _LayerSource(settings_cls, data))

    try:
        loaded = _Loaded(**dict(overrides or {}))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, layer.origins, StackConfig)) from None
    except ValueError as exc:  # pydantic-settings: an env value that is not valid JSON for a nested field
        raise ConfigError(f"environment: {exc}", hint="nested values in VSTACK_* variables must be JSON") from None
    config_obj = StackConfig.model_validate(loaded.model_dump())
    config_obj._origins = layer.origins
    check_references(config_obj, layer.origins)
    check_values(config_obj, layer.origins)
    return config_obj


def check_values(cfg: StackConfig, origins: Origins) -> None:
    """Ranges of engine options, then what needs them right: parallelism vs GPUs, gateway names, providers."""
    problems = check_engine_values(cfg, origins)
    if not problems:
        problems = check_parallel_fits_hardware(cfg)
    problems += check_gateway_names(cfg, origins) + check_cloud_providers(cfg, origins)
    if problems:
        raise ConfigError(problems, hint="fix the values above; `vstack config validate` checks them again")


def check_references(cfg: StackConfig, origins: Origins) -> None:
    """Names that point at other entries must exist (with did-you-mean when they do not)."""
    problems: list[str] = []

    def missing(path: tuple[str, ...], kind: str, value: str, known: Mapping[str, Any]) -> None:
        problems.append(
            f"{origins.where(path)}: {'.'.join(path)}: unknown {kind} {value!r}{suggest(value, known)}"
            f" (known: {', '.join(sorted(known)) or 'none'})"
        )

    for name, prof in cfg.profiles.items():
        if prof.hardware not in cfg.hardware:
            missing(("profiles", name, "hardware"), "hardware profile", prof.hardware, cfg.hardware)
        if prof.model not in cfg.models:
            missing(("profiles", name, "model"), "model", prof.model, cfg.models)
    for name, hw in cfg.hardware.items():
        if hw.recommended_model and hw.recommended_model not in cfg.models:
            missing(("hardware", name, "recommended_model"), "model", hw.recommended_model, cfg.models)
    if cfg.default_model not in cfg.models:
        missing(("default_model",), "model", cfg.default_model, cfg.models)
    if cfg.serve != "auto" and cfg.serve not in cfg.profiles and cfg.serve not in cfg.models \
            and unconfigured_model(cfg.serve) is None:
        known = {**cfg.profiles, **cfg.models, "auto": None}
        missing(("serve",), "profile or model", cfg.serve, known)
    servable = {**cfg.profiles, **cfg.models, **{m.api_name: m for m in cfg.models.values()}}
    for key in ("models", "preload"):
        for i, name in enumerate(getattr(cfg.manager, key) or []):
            if name not in servable and unconfigured_model(name) is None:  # a Hub id or a folder may be named too
                missing(("manager", key, str(i)), "model or profile", name, {**cfg.profiles, **cfg.models})
    if problems:
        raise ConfigError(problems)
