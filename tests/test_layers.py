"""The layers keep their order (.importlinter, adr/0010): errors -> config -> hardware/models/vllm -> planner
-> engine -> manager -> gateway -> assemble -> cli/entrypoints; no module imports a layer above its own."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contract_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    cli = pytest.importorskip("importlinter.cli", reason="import-linter is in the dev extra")
    monkeypatch.chdir(ROOT)
    assert cli.lint_imports(config_filename=str(ROOT / ".importlinter"), no_cache=True) == 0


def test_the_contract_would_catch_an_import_against_the_order() -> None:
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("stack")
    # What issue 16 found running backwards, now gone: the manager imported the gateway, config its consumers.
    assert not graph.chain_exists(importer="stack.manager", imported="stack.gateway", as_packages=True)
    assert not graph.chain_exists(importer="stack.config", imported="stack.gateway", as_packages=True)
    assert not graph.chain_exists(importer="stack.config", imported="stack.manager", as_packages=True)
    assert not graph.chain_exists(importer="stack.engine", imported="stack.manager", as_packages=True)
    assert graph.chain_exists(importer="stack.assemble", imported="stack.gateway", as_packages=True)
