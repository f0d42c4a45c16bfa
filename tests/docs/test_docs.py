"""The docs site: the generated reference equals what the code says now, and `mkdocs build --strict` passes
(no warnings: no broken link or anchor, no page left out of the nav)."""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GENERATOR = REPO / "docs" / "gen_reference.py"
FIX = "python docs/gen_reference.py"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_pages_are_what_the_code_generates(tmp_path: Path) -> None:
    gen = _generator()
    stale = []
    for fresh in gen.write(tmp_path):
        committed = REPO / "docs" / fresh.relative_to(tmp_path)
        old = committed.read_text().splitlines() if committed.exists() else []
        diff = list(difflib.unified_diff(old, fresh.read_text().splitlines(), str(committed.relative_to(REPO)),
                                         "generated", lineterm="", n=1))
        if diff:
            stale.append("\n".join(diff[:40]))
    assert not stale, f"the generated pages are stale: run `{FIX}` and commit the result\n\n" + "\n\n".join(stale)


def test_every_configuration_key_has_a_row_and_every_command_a_section(tmp_path: Path) -> None:
    """The generator walks the schema and the CLI: a key or a command it skipped would pass the diff test."""
    import typer

    from stack.cli import app
    from stack.config.schema import StackConfig

    gen = _generator()
    config = gen.configuration_page()
    for name in StackConfig.model_fields:
        assert f"| `{name}` |" in config
    assert "| `gateway.cloud[].api_key_env` |" in config and "| `manager.models` |" in config
    cli = gen.cli_page()
    root = typer.main.get_command(app)
    for name, command in root.commands.items():
        assert f"## `vstack {name}`" in cli
        for sub in getattr(command, "commands", {}):
            assert f"## `vstack {name} {sub}`" in cli
    assert "`--port`" in cli and "vstack up --port N" in config  # an option, and the key it sets


def test_mkdocs_build_is_strict_clean(tmp_path: Path) -> None:
    if shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None:
        pytest.fail("mkdocs is not installed: ./install.sh --dev installs it (the dev extra)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner, not a build problem
    proc = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING")]
    assert not warnings, "\n".join(warnings)
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").exists()


# Files the docs tell the user to create, or quote from an example error message.
# Made by the user or by a run: named in the docs, never committed.
USER_FILES = {"docker/.env", "configs/profiles/mine.yaml", "configs/models/tiny.yaml", "bench/out", "bench/out/"}
TOP = "stack|bench|configs|docker|patches|tests|adr|docs|loadtests|\\.ci"
PATH_IN_TEXT = re.compile(rf"(?<![\w/.~$-])((?:{TOP})/[\w./-]*)")


def test_every_repository_path_the_docs_name_exists() -> None:
    """README.md and docs/ (not the ADRs, which record what was true when they were written): a path into the
    repository that no longer exists is a stale instruction."""
    pages = [REPO / "README.md", *(p for p in (REPO / "docs").rglob("*.md") if "design/adr" not in p.as_posix())]
    missing = []
    for page in pages:
        text = page.read_text()
        for m in PATH_IN_TEXT.finditer(text):
            path = m[1].rstrip(".,:;")
            if text[m.end():m.end() + 1] in ("<", "{", "*", "$") or path in USER_FILES:
                continue  # a pattern (gpu-<device>-<date>.json, engine_args_0.{26,32}) or a file the user makes
            if re.fullmatch(r"adr/\d{4}", path) and list(REPO.glob(f"{path}-*.md")):
                continue
            if not (REPO / path).exists():
                missing.append(f"{page.relative_to(REPO)}: {path}")
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_every_page_is_in_the_nav() -> None:
    """mkdocs.yml lets pages out of the nav quietly (the ADRs are reached from design/decisions.md): any other
    page left out would be built but found by no one."""
    listed = set(re.findall(r":\s+(\S+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), re.MULTILINE))
    pages = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    left_out = sorted(p for p in pages - listed if not p.startswith("design/adr/"))
    assert not left_out, f"add these pages to the nav in mkdocs.yml: {left_out}"
    assert listed <= pages, f"the nav names pages that do not exist: {sorted(listed - pages)}"
