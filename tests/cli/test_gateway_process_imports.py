"""The gateway process `vstack up` starts (stack.cli.gateway_process) lives in the CLI package but must not
import the whole CLI before it spawns its engine: that cost every start ~0.15 s (issue 37)."""

from __future__ import annotations

import json
import subprocess
import sys

import stack.cli


def test_the_gateway_process_imports_no_command_module() -> None:
    code = ("import json, sys, stack.cli.gateway_process\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('stack.cli'))))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = json.loads(out)
    assert "stack.cli.gateway_process" in loaded
    assert "stack.cli.root" not in loaded, loaded
    assert not [m for m in loaded if m.endswith("_cmd")], loaded


def test_app_and_main_are_the_assembled_cli() -> None:
    from stack.cli import app, main
    from stack.cli.root import app as root_app

    assert app is root_app and callable(main) and main is stack.cli.main
    try:
        stack.cli.nothing  # noqa: B018
    except AttributeError as exc:
        assert "nothing" in str(exc)
    else:
        raise AssertionError("an unknown attribute of stack.cli must raise AttributeError")
