"""Triage rules (data, not code): the first rule that matches a change decides its bucket."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from stack.patches.tool_errors import LedgerError

RULES_FILE = Path(__file__).resolve().parents[3] / "patches" / "triage-rules.yaml"
LEADING_TAG = re.compile(r"\[([^\]]+)\]\s*")
PR_SUFFIX = re.compile(r"\(#(\d+)\)\s*$")


class Bucket(StrEnum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"
    SKIP = "skip"


@dataclass
class Change:
    """One upstream change: a commit (git range) or a changed file (release artifacts)."""

    ref: str  # commit sha or file path
    title: str
    paths: list[str]
    tags: list[str] = field(default_factory=list)
    status: str = "modified"  # added / removed / modified (file-level changes)
    prs: list[int] = field(default_factory=list)
    size: int = 0  # changed lines

    @classmethod
    def from_commit(cls, sha: str, subject: str, paths: list[str]) -> Change:
        # Tags are the leading bracket groups only ("[Bugfix][Kernel] Fix x"), not brackets later in the text.
        tags = []
        rest = subject.lstrip()
        while (m := LEADING_TAG.match(rest)) is not None:
            tags.append(m.group(1).strip())
            rest = rest[m.end() :]
        pr = PR_SUFFIX.search(subject)
        return cls(sha, subject, paths, tags, prs=[int(pr.group(1))] if pr else [])


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    bucket: Bucket
    why: str
    tags: list[str] = Field(default_factory=list, description="any of these title tags (case-insensitive)")
    paths_any: list[str] = Field(default_factory=list, description="some changed path matches a glob")
    paths_all: list[str] = Field(default_factory=list, description="every changed path matches a glob")
    title: str | None = Field(None, description="regular expression searched in the title")
    status: str | None = Field(None, pattern="^(added|removed|modified)$")

    @field_validator("title")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"bad regular expression {v!r}: {e}") from e
        return v

    def matches(self, c: Change) -> bool:
        if self.tags:
            wanted = {t.lower() for t in self.tags}
            if not any(t.lower() in wanted for t in c.tags):
                return False
        if self.paths_any and not any(_glob(p, self.paths_any) for p in c.paths):
            return False
        if self.paths_all and not (c.paths and all(_glob(p, self.paths_all) for p in c.paths)):
            return False
        if self.title and not re.search(self.title, c.title):
            return False
        return not (self.status and c.status != self.status)


def _glob(path: str, globs: list[str]) -> bool:
    return any(fnmatchcase(path, g) for g in globs)


class RuleSet(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = 1
    buckets: dict[Bucket, str]
    rules: list[Rule] = Field(min_length=1)
    default: Rule

    def classify(self, c: Change) -> Rule:
        for rule in self.rules:
            if rule.matches(c):
                return rule
        return self.default


def load_rules(path: Path | None = None) -> RuleSet:
    path = path or RULES_FILE
    try:
        raw: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
        return RuleSet.model_validate(raw)
    except OSError as e:
        raise LedgerError(f"{path}: cannot read triage rules ({e.strerror})", hint="pass --rules PATH") from e
    except yaml.YAMLError as e:
        raise LedgerError(f"{path}: not valid YAML: {e}") from e
    except ValidationError as e:
        problems = [f"{path}: {'.'.join(str(x) for x in er['loc'])}: {er['msg']}" for er in e.errors()]
        raise LedgerError(problems, hint="each rule needs id, bucket (high/medium/low/skip) and why") from e
