"""loadtests/ holds the one copy of the locustfile and the scenarios: read there in a checkout, and carried
inside the wheel as stack/_loadtests, where an installed vllm-stack finds them (as configs/ is carried)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from stack.files import shipped_folder
from stack.load.scenario import find_scenario, loadtests_dir, scenarios_dir

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = {"chat", "rag", "ramp", "smoke", "upgrade", "gpu-8b-goodput", "gpu-8b-1024-128", "gpu-70b-goodput"}


def test_one_copy_at_the_top_level() -> None:
    assert loadtests_dir() == REPO / "loadtests"
    assert {p.stem for p in scenarios_dir().glob("*.yaml")} == SCENARIOS
    assert find_scenario("smoke") == REPO / "loadtests" / "scenarios" / "smoke.yaml"
    # Nothing left in the package: no scenarios folder, no scenario file, no second locustfile.
    assert not (REPO / "stack" / "load" / "scenarios").exists()
    assert not [p for p in (REPO / "stack").rglob("*.yaml") if p.stem in SCENARIOS]
    assert not list((REPO / "stack").rglob("locustfile*.py"))


def test_the_wheel_maps_loadtests_where_the_lookup_reads_them(tmp_path: Path) -> None:
    with open(REPO / "pyproject.toml", "rb") as f:
        force = tomllib.load(f)["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert force["loadtests"] == "stack/_loadtests" and force["configs"] == "stack/_configs"
    installed = tmp_path / "site" / "stack"
    (installed / "_loadtests").mkdir(parents=True)
    (installed / "_loadtests" / "locustfile.py").write_text("")
    assert shipped_folder("loadtests", "locustfile.py", installed) == installed / "_loadtests"
    (tmp_path / "site" / "loadtests").mkdir()  # a checkout's own folder comes first ...
    assert shipped_folder("loadtests", "locustfile.py", installed) == installed / "_loadtests"
    (tmp_path / "site" / "loadtests" / "locustfile.py").write_text("")  # ... once it holds the locustfile
    assert shipped_folder("loadtests", "locustfile.py", installed) == tmp_path / "site" / "loadtests"
    assert shipped_folder("loadtests", "locustfile.py", tmp_path / "elsewhere" / "stack") is None


def test_the_built_wheel_carries_them_and_an_install_finds_them(tmp_path: Path) -> None:
    """Build the wheel (hatchling, the build backend: in the dev extra), unpack it as pip would install it, and
    ask the unpacked package, away from any checkout, where its scenarios and locustfile are."""
    wheel_builder = pytest.importorskip("hatchling.builders.wheel", reason="needs hatchling (the dev extra)")
    wheel = Path(next(iter(wheel_builder.WheelBuilder(str(REPO)).build(directory=str(tmp_path / "dist")))))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {Path(n).stem for n in names if n.startswith("stack/_loadtests/scenarios/")}
    assert shipped == SCENARIOS
    assert {"stack/_loadtests/locustfile.py", "stack/_loadtests/README.md"} <= set(names)
    assert not [n for n in names if n.startswith("stack/load/scenarios/")]
    assert [n for n in names if n.endswith("locustfile.py")] == ["stack/_loadtests/locustfile.py"]
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = ("from stack.load.scenario import find_scenario, loadtests_dir\n"
             "print(loadtests_dir()); print(find_scenario('ramp'))")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(site)}  # before the venv's editable install of a checkout
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(site / "stack" / "_loadtests"),
                                   str(site / "stack" / "_loadtests" / "scenarios" / "ramp.yaml")]  # fmt: skip
