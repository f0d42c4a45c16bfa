"""`vstack keys add/list/revoke/usage/hash` against a real gateway (in a thread, before the paced stand-in engine),
through Typer's CliRunner as a user runs them."""

from __future__ import annotations

import hashlib
import json

import httpx
from typer.testing import CliRunner

from bench.harness.gateway_thread import app_in_thread
from bench.harness.paced_engine import PacedEngine, serving
from stack.cli.root import app

runner = CliRunner()


def gateway(engine_url: str, tmp_path):
    from stack.config.sections.gateway import GatewayConfig
    from stack.gateway.app import create_app
    from stack.gateway.registry import Deployment, DeploymentRegistry

    registry = DeploymentRegistry()
    registry.add(Deployment(id="engine", model_group="smol", kind="local", upstream_model="smol", api_base=engine_url))
    cfg = GatewayConfig(liveness={"enabled": False}, spill={"enabled": False})
    return create_app(cfg, default_model="smol", registry=registry, environ={}, state_file=tmp_path / "runtime.json")


def test_keys_add_list_usage_revoke_and_hash(tmp_path) -> None:
    env = {"VSTACK_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "300", "VSTACK_CONFIG": ""}
    with serving(PacedEngine(2, 1)) as eng, app_in_thread(gateway(eng, tmp_path)) as (url, _):

        def vstack(*args: str, stdin: str | None = None):
            return runner.invoke(app, [*args, "--url", url] if args[1] != "hash" else list(args), env=env,
                                 input=stdin)  # fmt: skip

        added = vstack("keys", "add", "alice", "--priority", "high", "--rpm", "1", "--model", "smol")
        assert added.exit_code == 0, added.output
        key = added.output.strip().splitlines()[-1]
        assert key.startswith("vsk-") and "shown this once" in added.output
        assert key not in (tmp_path / "runtime.json").read_text()

        ask = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        auth = {"Authorization": f"Bearer {key}"}
        assert httpx.post(f"{url}/v1/chat/completions", json=ask, headers=auth).status_code == 200
        assert httpx.post(f"{url}/v1/chat/completions", json=ask, headers=auth).status_code == 429

        listed = vstack("keys", "list")
        assert listed.exit_code == 0 and "alice" in listed.output and "rpm 1" in listed.output
        assert "1 req" in listed.output and key not in listed.output
        usage = vstack("keys", "usage", "--format", "csv")
        assert usage.exit_code == 0
        assert "alice,smol,1,0,1,0,1,3,0.0" in usage.output.splitlines()  # "hi" is 1 token, 3 out, 1 refused
        as_json = json.loads(vstack("keys", "usage", "alice", "--format", "json").output)
        assert as_json["usage"][0]["refused"] == 1

        again = vstack("keys", "add", "alice")
        assert again.exit_code != 0 and "--replace" in again.output

        revoked = vstack("keys", "revoke", "alice")
        assert revoked.exit_code == 0 and "revoked alice" in revoked.output
        assert httpx.post(f"{url}/v1/chat/completions", json=ask, headers=auth).status_code == 401
        assert httpx.post(f"{url}/v1/chat/completions", json=ask).status_code == 401  # not open again
        gone = vstack("keys", "revoke", "alice")
        assert gone.exit_code != 0 and "no named key 'alice'" in gone.output

    hashed = runner.invoke(app, ["keys", "hash"], input="my-secret\n")
    assert hashed.exit_code == 0 and hashed.output.strip() == hashlib.sha256(b"my-secret").hexdigest()
