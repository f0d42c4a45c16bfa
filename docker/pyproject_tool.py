"""Image builds read pyproject.toml instead of repeating it (stdlib only: runs on the bare base image).

    python3 pyproject_tool.py requirements cpu,gateway   # the dependencies and those extras' dependencies
    python3 pyproject_tool.py force-include-dirs          # create the wheel's force-include sources missing here

The first lets a layer install every dependency before the code is copied (code edits keep that layer);
the second lets `pip install -e .` build in an image that leaves configs/ and loadtests/ out on purpose
(configs/ is mounted at run time).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def _project(path: Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def requirements(data: dict, extras: list[str]) -> list[str]:
    project = data["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"pyproject.toml has no extra {', '.join(unknown)} (has: {', '.join(optional)})")
    return [*project.get("dependencies", []), *(dep for e in extras for dep in optional[e])]


def force_include_sources(data: dict) -> list[str]:
    wheel = data.get("tool", {}).get("hatch", {}).get("build", {}).get("targets", {}).get("wheel", {})
    return list(wheel.get("force-include", {}))


def main(argv: list[str]) -> int:
    pyproject = Path("pyproject.toml")
    data = _project(pyproject)
    if argv[:1] == ["requirements"] and len(argv) == 2:
        print("\n".join(requirements(data, [e for e in argv[1].split(",") if e])))
    elif argv == ["force-include-dirs"]:
        for source in force_include_sources(data):
            if not Path(source).exists():
                Path(source).mkdir(parents=True)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
