"""The CLI against a gateway it did not start (`--url` / VSTACK_URL, as Compose or another host): status,
models, switch with its progress, a switch to a configured model the gateway does not manage or to a typo,
and `bench load`'s target check. The gateway is the real app with the real model manager; its engines are
the manager tests' in-memory stand-ins (tests/manager/conftest.py), since no answer from a model is needed
here, and its cloud deployment is never called (the load test is refused before any request)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stack.assemble.runtimes import engine_supervisor
from stack.config.sections.gateway import GatewayConfig
from stack.config.sections.manager import ManagerConfig
from stack.gateway.engines import ManagedEngine
from tests.manager.conftest import GIB, StandIn, gateway_with

CLOUD = {"model_name": "gpt-4o-mini", "litellm_params": {"model": "openai/gpt-4o-mini",
                                                         "api_base": "http://127.0.0.1:9/v1"}}


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    """Two local models (smol ready at start, b asleep in the wings) and a cloud fallback for b; an embedding
    model listed before them all (`a-embed`), as a newcomer's gateway listed all-minilm-l6-v2 first."""
    smol, b, embed = StandIn("smol", need=GIB), StandIn("b", need=GIB, start_s=1.5), StandIn("a-embed", need=GIB)
    engines = [ManagedEngine(smol, "smol", "smol", need=GIB), ManagedEngine(b, "b", "b", need=GIB, preload=False),
               ManagedEngine(embed, "a-embed", "a-embed", need=GIB, preload=False, task="embed")]  # fmt: skip
    sup = engine_supervisor(engines, 60, 5, ManagerConfig(min_residency_s=0, quiet_s=0))
    settings = GatewayConfig(cloud=[CLOUD], fallbacks={"b": ["gpt-4o-mini"]})
    with gateway_with(sup, "smol", settings) as gw:
        yield gw.url


def vstack(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, with a state folder of its own: nothing `vstack up` started here."""
    # Port 0: no gateway of another test on this machine's default port is found by accident.
    full = {**os.environ, "VSTACK_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "80", "VSTACK_GATEWAY__PORT": "0",
            **env}
    full.pop("VSTACK_URL", None) if "VSTACK_URL" not in env else None
    return subprocess.run([sys.executable, "-m", "stack.entrypoints.cli", *args], env=full, text=True,
                          capture_output=True, timeout=120, check=False)


def test_status_and_models_see_a_gateway_named_by_url_or_env(gateway: str, tmp_path: Path) -> None:
    alone = vstack(tmp_path, "status")
    assert alone.returncode == 0 and "nothing is running" in alone.stdout
    by_flag = vstack(tmp_path, "status", "--url", gateway, "--json")
    assert by_flag.returncode == 0, by_flag.stderr
    rows = {r["name"]: r for r in json.loads(by_flag.stdout)}
    assert rows["smol"]["state"] == "ready" and rows["smol"]["url"] == f"{gateway}/v1"
    assert "gpt-4o-mini" in rows
    by_env = vstack(tmp_path, "models", "--json", VSTACK_URL=gateway)
    assert by_env.returncode == 0, by_env.stderr
    assert {r["model"] for r in json.loads(by_env.stdout)} >= {"smol", "b"}
    table = vstack(tmp_path, "--url", gateway, "status")  # on the root command too
    assert table.returncode == 0 and f"{gateway}/v1" in table.stdout  # whole, at 80 columns
    models = vstack(tmp_path, "models", "--url", gateway)
    assert models.returncode == 0 and "gpt-4o-mini" in models.stdout and "…" not in models.stdout
    assert max(len(line) for line in models.stdout.splitlines() + table.stdout.splitlines()) <= 80


def test_status_finds_a_gateway_on_the_configured_port(gateway: str, tmp_path: Path) -> None:
    """A Compose deployment publishes the gateway on gateway.port: `vstack status` on the host sees it."""
    port = gateway.rsplit(":", 1)[1]
    proc = vstack(tmp_path, "status", "--json", VSTACK_GATEWAY__PORT=port)
    assert proc.returncode == 0, proc.stderr
    assert "smol" in {r["name"] for r in json.loads(proc.stdout)}


def test_switch_shows_its_progress(gateway: str, tmp_path: Path) -> None:
    proc = vstack(tmp_path, "switch", "b", "--url", gateway)
    assert proc.returncode == 0, proc.stderr
    assert "b: ready" in proc.stdout
    assert "b: starting" in proc.stderr  # the phase it went through, not silence
    back = vstack(tmp_path, "switch", "smol", "--url", gateway, "--json")
    assert back.returncode == 0 and json.loads(back.stdout)["state"] == "ready"


def test_switch_to_a_configured_model_the_gateway_does_not_manage_says_what_to_add(gateway: str,
                                                                                  tmp_path: Path) -> None:
    proc = vstack(tmp_path, "switch", "qwen2.5-7b-instruct", "--url", gateway)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "manager.models" in proc.stderr and "vstack models add qwen2.5-7b-instruct" in proc.stderr
    assert "404" not in proc.stderr


def test_switch_to_a_typo_says_did_you_mean(gateway: str, tmp_path: Path) -> None:
    proc = vstack(tmp_path, "switch", "smoll", "--url", gateway)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "did you mean 'smol'" in proc.stderr and "404" not in proc.stderr


def test_bench_load_refuses_a_model_that_falls_back_to_a_cloud_provider(gateway: str, tmp_path: Path) -> None:
    from stack.errors import ExitCode

    cloud = vstack(tmp_path, "bench", "load", "--url", gateway, "--model", "gpt-4o-mini", "--duration", "5")
    assert cloud.returncode == ExitCode.LOAD_TEST, cloud.stdout + cloud.stderr
    assert "cloud provider" in cloud.stderr and "--allow-cloud" in cloud.stderr
    spill = vstack(tmp_path, "bench", "load", "--url", gateway, "--model", "b", "--duration", "5")
    assert spill.returncode == ExitCode.LOAD_TEST and "b falls back to gpt-4o-mini" in spill.stderr
    typo = vstack(tmp_path, "bench", "load", "--url", gateway, "--model", "smoll", "--duration", "5")
    assert typo.returncode == ExitCode.LOAD_TEST and "did you mean 'smol'" in typo.stderr


def test_bench_load_refuses_an_embedding_model_and_a_cloud_fallback_by_their_real_reason(gateway: str,
                                                                                         tmp_path: Path) -> None:
    """Issue 50: `--model smollm2-135m-instruct` was refused with "fix: name a local model with --model"
    although one was named; the reason was its cloud fallback. Each refusal says its own reason."""
    from stack.errors import ExitCode

    embed = vstack(tmp_path, "bench", "load", "--url", gateway, "--model", "a-embed", "--duration", "5")
    assert embed.returncode == ExitCode.LOAD_TEST, embed.stdout + embed.stderr
    text = " ".join(embed.stderr.split())  # rich folds long lines at 80 columns
    assert "--model a-embed: a-embed is an embedding model (task: embed)" in text
    assert "fix: name a chat model: --model smol" in text
    spill = vstack(tmp_path, "bench", "load", "--url", gateway, "--model", "b", "--duration", "5")
    text = " ".join(spill.stderr.split())
    assert "a cloud provider may answer (and bill) its requests" in text
    assert "pass --allow-cloud to send to it anyway" in text and "--model smol" in text
    assert "name a local model with --model" not in text


def test_no_model_named_picks_a_local_chat_model_never_the_embedding_model_listed_first(gateway: str) -> None:
    from stack.load.scenario import find_scenario, load_scenario_file
    from stack.load.target import decide_target

    scenario = load_scenario_file(find_scenario("smoke"))
    target = decide_target(gateway, scenario, None, allow_cloud=False)
    assert target.models == {"smol": 1.0}
    # What `vstack bench load` prints before the first request (it prints describe()).
    assert target.describe().endswith("picked smol: the first local chat model listed (a-embed is an embedding model "
                                      "(task: embed): it serves /v1/embeddings, and every scenario sends "
                                      "/v1/chat/completions; b falls back to gpt-4o-mini (openai/gpt-4o-mini): a cloud "
                                      "provider may answer (and bill) its requests; gpt-4o-mini is served by "
                                      "openai/gpt-4o-mini: a cloud provider may answer (and bill) its "
                                      "requests)")  # fmt: skip


def test_the_load_target_is_decided_and_shown_before_any_request(gateway: str) -> None:
    from stack.load.scenario import find_scenario, load_scenario_file
    from stack.load.target import decide_target

    scenario = load_scenario_file(find_scenario("smoke"))
    target = decide_target(gateway, scenario, "smol", allow_cloud=False)
    assert target.models == {"smol": 1.0} and target.cloud == []
    assert "smol (local engine-smol)" in target.describe()
    allowed = decide_target(gateway, scenario, "gpt-4o-mini", allow_cloud=True)
    assert allowed.cloud == ["gpt-4o-mini is served by openai/gpt-4o-mini"]
