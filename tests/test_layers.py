"""The layers keep their order (.importlinter, adr/0010): errors -> config -> hardware/models/vllm -> planner
-> engine -> manager -> gateway -> assemble -> cli/entrypoints; no module imports a layer above its own."""

from __future__ import annotations

import importlib.util
import re
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
        assert (
            not graph.chain_exists(importer="bench.gpu", imported=script, as_packages=True)
            or script == "bench.switch_gpu"
        ), script
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


LONGEST_MODULE = 450  # lines: a module longer than this holds more than one concern (issue 51)
SUFFIXES = ("ings", "ing", "ers", "er", "ed", "es", "s")  # English endings that leave one name's meaning


def name_root(name: str) -> str:
    """`fitting` -> `fit`, `plans` -> `plan`, `planning` -> `plan`: a module name without one English ending
    (and the consonant the ending doubled)."""
    for suffix in SUFFIXES:
        if name.endswith(suffix) and len(name) - len(suffix) >= 3:
            name = name[: -len(suffix)]
            break
    return re.sub(r"([b-df-hj-np-tv-z])\1$", r"\1", name)


def twin_names(names: list[str]) -> list[tuple[str, str]]:
    """Pairs of module names of one package that differ only by a suffix: `fit`/`fitting`, `plan`/`plans`,
    `cpu`/`cpu_dtype` (a reader cannot tell from the names which of the two decides what)."""
    names = sorted(n for n in names if n != "__init__")
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
            if name_root(a) == name_root(b) or b.startswith(f"{a}_") or a.startswith(f"{b}_")]  # fmt: skip


def test_no_module_is_longer_than_450_lines_nor_named_like_a_sibling() -> None:
    """Issue 51: a 708-line manager, `fit.py`/`fitting.py`/`fit_decisions.py`, `stack_plan.py`/`stack_planning.py`:
    the names did not say which module decides what, and long files mixed concerns."""
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "stack").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > LONGEST_MODULE}  # fmt: skip
    assert not long, f"over {LONGEST_MODULE} lines: {long}: split each by concern, named by what each part does"
    packages: dict[Path, list[str]] = {}
    for path in (ROOT / "stack").rglob("*.py"):
        packages.setdefault(path.parent, []).append(path.stem)
    twins = {str(d.relative_to(ROOT)): pairs for d, names in packages.items() if (pairs := twin_names(names))}
    assert not twins, f"module names that differ only by a suffix: {twins}: name each by what it decides"


def test_the_name_rule_catches_the_names_issue_51_found() -> None:
    fit = [("fit", "fit_decisions"), ("fit", "fitting")]
    assert twin_names(["fit", "fitting", "fit_decisions", "decisions"]) == fit
    plan = [("plan", "plans"), ("stack_plan", "stack_planning")]
    assert twin_names(["stack_plan", "stack_planning", "plans", "plan"]) == plan
    assert twin_names(["cpu", "cpu_dtype"]) == [("cpu", "cpu_dtype")]
    assert twin_names(["sizing", "decisions", "fit_planner", "model_planner", "stack_planner", "__init__"]) == []
