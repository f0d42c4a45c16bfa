"""The layers keep their order (.importlinter, adr/0010): errors -> config -> hardware/models/vllm -> planner
-> engine -> manager -> gateway -> assemble -> cli/entrypoints; no module imports a layer above its own."""

from __future__ import annotations

import importlib.util
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


def test_benchmarks_and_tests_share_only_the_harness() -> None:
    """Issue 28 found them tangled both ways: bench/ray_local.py imported tests/support, tests/cluster imported
    bench/ray_local.py, gpu/layouts imported planner_check. Now both sides use bench.harness."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("stack", "bench", "tests")
    assert not graph.chain_exists(importer="bench", imported="tests", as_packages=True)
    assert not graph.chain_exists(importer="stack", imported="bench", as_packages=True)
    scripts = {m for m in graph.find_children("bench") if m not in ("bench.harness", "bench.gpu")}
    for script in scripts:
        assert not graph.chain_exists(importer="tests.cluster", imported=script, as_packages=True), script
        assert not graph.chain_exists(importer="bench.gpu", imported=script, as_packages=True) or script == \
            "bench.switch_gpu", script
    assert graph.chain_exists(importer="tests.cluster", imported="bench.harness", as_packages=True)


def test_the_committed_import_graph_is_the_current_one() -> None:
    """adr/0010's picture is generated; a stale one (it once missed four edges) fails here, with the fix."""
    pytest.importorskip("grimp")
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / ".ci" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    files, against, _ = module.render()
    assert against == []
    stale = [str(path.relative_to(ROOT)) for path, text in files.items() if path.read_text() != text]
    assert not stale, f"{stale} stale: run .venv/bin/python .ci/import_graph.py and commit what it writes"
