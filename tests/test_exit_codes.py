"""One exit-code table (stack.errors.EXIT_CODES): the documented table (docs/reference/exit-codes.md, generated)
is the same, each error kind has its own code, and every StackError class in the package uses a code of the table."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import stack
from stack.errors import EXIT_CODES, ExitCode, StackError

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "exit-codes.md"


def documented_table() -> dict[int, str]:
    section = PAGE.read_text()
    return {int(m[1]): m[2].strip() for m in re.finditer(r"^\| (\d+) \| (.+?) \|$", section, re.MULTILINE)}


def test_the_documented_table_is_the_code_table() -> None:
    assert documented_table() == {int(code): text for code, text in EXIT_CODES.items()}


def test_every_code_has_a_meaning_and_one_meaning_only() -> None:
    assert set(EXIT_CODES) == set(ExitCode)
    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES)


def _subclasses(cls: type) -> list[type]:
    return [cls, *(s for sub in cls.__subclasses__() for s in _subclasses(sub))]


def test_every_error_kind_exits_with_a_code_of_the_table() -> None:
    for mod in pkgutil.walk_packages(stack.__path__, "stack."):
        if ".plugins.runtime_patches" in mod.name:
            continue  # loaded by vLLM inside its own processes
        try:
            importlib.import_module(mod.name)
        except ImportError:
            continue  # an optional extra that is not installed here
    codes = {cls.__name__: cls.exit_code for cls in _subclasses(StackError)}
    assert all(code in set(ExitCode) for code in codes.values()), codes
    # The kinds the documentation names each have their own code (6 no longer means four things).
    assert codes["FitError"] == ExitCode.DOES_NOT_FIT
    assert codes["PatchError"] == ExitCode.PATCH and codes["TriageError"] == ExitCode.TRIAGE
    assert codes["LoadTestError"] == ExitCode.LOAD_TEST and codes["BenchError"] == ExitCode.BENCH
    assert len({codes[k] for k in ("FitError", "PatchError", "LoadTestError", "BenchError")}) == 4
