"""Every `__main__` of the stack lives in stack/entrypoints/, and every child process is named by module object
(issue 28, item 4): a module that moves takes its children's command with it, and a command naming a module
that is gone fails here, not in a user's `vstack up`."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from stack import engine_env, model_convert
from stack.engine.docker_runtime import CONTAINER_ENTRY
from stack.load import bench_worker
from stack.vllm import introspect, launcher

ROOT = Path(__file__).resolve().parents[1]
STACK = ROOT / "stack"


def test_every_main_is_an_entry_point() -> None:
    mains = sorted(str(p.relative_to(ROOT)) for p in STACK.rglob("*.py") if "__name__ == \"__main__\"" in p.read_text())
    assert mains and all(m.startswith("stack/entrypoints/") for m in mains), mains


def test_children_are_started_by_module_object() -> None:
    """No `"-m", "stack.…"` literal below the entry points: every child is named through engine_env.child_argv."""
    named = sorted((str(p.relative_to(ROOT)), m) for p in STACK.rglob("*.py")
                   for m in re.findall(r'"-m",\s*"(stack\.[\w.]+)"', p.read_text()))  # fmt: skip
    assert named == [], named


def test_the_names_the_stack_runs_resolve() -> None:
    for name in (engine_env.RUN_ENTRY, CONTAINER_ENTRY):
        assert importlib.util.find_spec(name) is not None, name
    for module in (launcher, introspect, model_convert, bench_worker):
        assert callable(module.main), module.__name__
        assert engine_env.child_argv("py", module, "x") == ["py", "-m", "stack.entrypoints.run", module.__name__, "x"]
    for image in ("engine-cpu", "engine-gpu"):
        assert f'"-m", "{CONTAINER_ENTRY}", "serve"' in (ROOT / "docker" / f"{image}.Dockerfile").read_text(), image


def test_the_run_entry_runs_a_child_and_refuses_what_is_none() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", engine_env.RUN_ENTRY, *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, env=engine_env.engine_python_env())

    usage = run("stack.model_convert")  # the child's own main, with its own (missing) arguments
    assert usage.returncode == 2 and "MODEL.gguf OUT_DIR" in usage.stderr
    assert run("os").returncode == 2  # not a module of the stack
    refused = run("stack.errors")
    assert refused.returncode == 2 and "has no main()" in refused.stderr
