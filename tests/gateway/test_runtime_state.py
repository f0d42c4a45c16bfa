"""Runtime state (issue 34, item 9): what /admin changes survives a restart, and what cannot be removed.

- A managed engine's own deployment cannot be deleted (409 naming `unload`): before, it answered 200 and the
  model could then never be loaded again (404) while its engine ran on. The engine here is the mock OpenAI
  server run as the engine process (as in test_engines.py): the manager and the registry are under test.
- Deployments and adapters added through /admin are kept in state_dir/runtime.json and added again, through
  the same checks, when the gateway starts; what no longer passes is skipped with its reason; the log and
  /admin/models say which. A full disk (a mounted 64 KiB tmpfs) is said in the admin call's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import save_file

from bench.harness.gateway_thread import Gateway, app_in_thread
from bench.harness.waiting import wait_for
from stack.assemble.runtimes import engine_supervisor
from stack.cli.status_cmd import _warnings
from stack.config.sections.gateway import GatewayConfig
from stack.gateway.engines import ManagedEngine
from stack.gateway.registry import DeploymentRegistry
from stack.gateway.routing.adapters import Base
from tests.engine.test_disk_full import fill, full_disk

from .conftest import local, run_gateway
from .test_engines import mock_engine

pytestmark = pytest.mark.lifecycle


def test_the_managed_engines_deployment_cannot_be_deleted_and_the_model_stays_loadable(tmp_path) -> None:
    engine = mock_engine(tmp_path)
    sup = engine_supervisor([ManagedEngine(engine, "smol", "smol")], startup_timeout_s=30, stop_grace_s=5)
    with run_gateway(GatewayConfig(), default_model="smol", manager=sup.manager) as gw:
        asyncio.run_coroutine_threadsafe(sup.start(gw.state), gw.loop).result(10)
        wait_for(lambda: httpx.get(f"{gw.url}/ready").status_code == 200)
        r = httpx.delete(f"{gw.url}/admin/deployments/engine-smol")
        assert r.status_code == 409, r.text
        err = r.json()["error"]
        assert err["code"] == "deployment_managed" and "/admin/models/smol/unload" in err["message"], err
        assert gw.state.registry.get("engine-smol") is not None
        unloaded = httpx.post(f"{gw.url}/admin/models/smol/unload", timeout=30).json()
        assert unloaded["state"] == "stopped" and engine.exit_code() is not None  # the engine is really stopped
        loaded = httpx.post(f"{gw.url}/admin/models/smol/load", timeout=60)
        assert loaded.status_code == 200 and loaded.json()["state"] == "ready", loaded.text
        body = {"model": "smol", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(f"{gw.url}/v1/chat/completions", json=body).status_code == 200
        asyncio.run_coroutine_threadsafe(sup.stop(gw.state), gw.loop).result(30)


def _adapter(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    # Real safetensors: the gateway reads every tensor before it accepts an adapter (small, finite weights).
    save_file({"base_model.model.q_proj.lora_A.weight": np.full((8, 4), 0.01, np.float32)},
              str(folder / "adapter_model.safetensors"))
    return folder


@contextlib.contextmanager
def gateway(state_file: Path) -> Iterator[Gateway]:
    """A gateway with one LoRA base (registered at start, as the engine supervisor does) keeping its runtime
    changes in `state_file`; stopped and started again by each `with`."""
    from stack.gateway.app import create_app

    async def lora_base(state) -> None:
        state.registry.add(local("base", "http://127.0.0.1:9", "lora-base"))
        state.adapters.add_base(Base("lora-base", max_lora_rank=8, max_loras=1, max_cpu_loras=2))

    app = create_app(GatewayConfig(), default_model="lora-base", registry=DeploymentRegistry(), environ={},
                     on_startup=[lora_base], state_file=state_file)  # fmt: skip
    with app_in_thread(app) as (url, loop):
        yield Gateway(url, app, loop)


def _runtime(gw: Gateway) -> dict:
    return httpx.get(f"{gw.url}/admin/models").json()["gateway"]["runtime_state"]


def test_admin_changes_survive_a_restart_and_what_no_longer_passes_is_skipped(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="stack.gateway.runtime_state")
    state_file = tmp_path / "state" / "runtime.json"
    folder = _adapter(tmp_path / "adapters" / "good")
    with gateway(state_file) as gw:
        added = httpx.post(f"{gw.url}/admin/deployments", json={"model_group": "extra", "kind": "local",
                                                               "api_base": "http://127.0.0.1:9"})  # fmt: skip
        assert added.status_code == 201 and "warning" not in added.json(), added.text
        extra_id = added.json()["id"]
        # 60 s: the adapter's tensors are read on a thread, which a loaded 2-core machine may delay past 5 s
        good = {"name": "good", "base": "lora-base", "path": str(folder)}
        assert httpx.post(f"{gw.url}/admin/adapters", json=good, timeout=60).status_code == 201
        assert _runtime(gw)["restored"] == []
    assert set(json.loads(state_file.read_text())["deployments"]) == {extra_id}
    with gateway(state_file) as gw:  # restarted: both are back, and it says so
        assert gw.state.registry.get(extra_id).model_group == "extra"
        assert [a["name"] for a in httpx.get(f"{gw.url}/admin/adapters").json()["adapters"]] == ["good"]
        assert _runtime(gw)["restored"] == [f"deployment {extra_id}", "adapter good"]
        assert any("restored 2 runtime change(s)" in r.getMessage() for r in caplog.records)
        notes = _warnings(httpx.get(f"{gw.url}/admin/models").json()["gateway"])  # what `vstack status` prints
        assert notes == [f"restored at start from {state_file}: deployment {extra_id}, adapter good"], notes
    shutil.rmtree(folder)
    with gateway(state_file) as gw:  # the adapter's folder is gone: skipped, with the reason
        runtime = _runtime(gw)
        assert runtime["restored"] == [f"deployment {extra_id}"]
        assert runtime["skipped"][0]["what"] == "adapter good" and "does not exist" in runtime["skipped"][0]["why"]
        assert any(w.startswith("runtime change not restored: adapter good") for w in
                   _warnings(httpx.get(f"{gw.url}/admin/models").json()["gateway"]))  # fmt: skip
        assert httpx.delete(f"{gw.url}/admin/deployments/{extra_id}").json() == {"removed": extra_id}
    with gateway(state_file) as gw:  # deleted: not back
        assert gw.state.registry.get(extra_id) is None


def test_a_runtime_change_on_a_full_disk_says_it_was_not_persisted(tmp_path) -> None:
    with full_disk(tmp_path) as disk:
        if disk is None:
            pytest.skip("cannot mount a tmpfs here (no full disk to write to)")
        fill(disk)
        with gateway(disk / "runtime.json") as gw:
            r = httpx.post(f"{gw.url}/admin/deployments", json={"model_group": "extra", "kind": "local",
                                                               "api_base": "http://127.0.0.1:9"})  # fmt: skip
            assert r.status_code == 201 and "not persisted" in r.json()["warning"], r.text
            assert "No space left on device" in _runtime(gw)["write_error"]


def test_a_lone_surrogate_in_a_deployment_is_refused_and_nothing_is_kept(tmp_path) -> None:
    """Issue 49, item 2: raw bytes ED A0 80 (a UTF-16 surrogate as UTF-8) in upstream_model. Before: 500, yet
    registered and saved, and /admin/models answered 500 from then on, after every restart too."""
    state_file = tmp_path / "runtime.json"
    with gateway(state_file) as gw:
        body = (b'{"model_group": "x", "kind": "local", "api_base": "http://127.0.0.1:9", '
                b'"upstream_model": "a\xed\xa0\x80"}')
        r = httpx.post(f"{gw.url}/admin/deployments", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_text" and err["param"] == "upstream_model"
        assert "nothing was added" in err["message"]
        escaped = json.dumps({"model_group": "y\ud800", "kind": "local", "api_base": "http://127.0.0.1:9"})
        r = httpx.post(f"{gw.url}/admin/deployments", content=escaped, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "model_group"
        assert [d.model_group for d in gw.state.registry.all()] == ["lora-base"]
        assert httpx.get(f"{gw.url}/admin/models").status_code == 200
        assert httpx.get(f"{gw.url}/admin/engines").status_code == 200
    assert not state_file.exists()


def test_a_bad_runtime_entry_is_skipped_shown_and_removable_by_vstack(tmp_path, monkeypatch) -> None:
    """An entry in runtime.json that cannot load (a surrogate written as \\ud800 by hand or by an older gateway)
    is skipped with its reason; the others load, every listing answers, `vstack deployments rm` removes it."""
    from typer.testing import CliRunner

    from stack.cli.root import app as cli

    state_file = tmp_path / "runtime.json"
    good = {"model_group": "good", "kind": "local", "api_base": "http://127.0.0.1:9", "id": "good-1"}
    bad = {"model_group": "bad", "kind": "local", "api_base": "http://127.0.0.1:9", "upstream_model": "m\ud800",
           "id": "bad-1"}  # fmt: skip
    state_file.write_text(json.dumps({"version": 1, "deployments": {"good-1": good, "bad\ud800": bad}}))
    with gateway(state_file) as gw:
        models = httpx.get(f"{gw.url}/admin/models")
        assert models.status_code == 200, models.text
        runtime = models.json()["gateway"]["runtime_state"]
        assert runtime["restored"] == ["deployment good-1"]
        (skip,) = runtime["skipped"]
        assert skip["what"] == "deployment bad\\ud800" and "upstream_model is not valid text" in skip["why"]
        assert skip["remove"] == "vstack deployments rm bad\\ud800"
        assert httpx.get(f"{gw.url}/admin/engines").status_code == 200
        monkeypatch.setenv("VSTACK_URL", gw.url)
        monkeypatch.setenv("VSTACK_STATE_DIR", str(tmp_path / "cli-state"))
        listed = CliRunner().invoke(cli, ["deployments"])
        assert listed.exit_code == 0 and "good-1" in listed.output and "bad\\ud800" in listed.output, listed.output
        removed = CliRunner().invoke(cli, ["deployments", "rm", "bad\\ud800"])
        assert removed.exit_code == 0 and "removed bad\\ud800" in removed.output, removed.output
    assert set(json.loads(state_file.read_text())["deployments"]) == {"good-1"}


def test_a_deployment_that_cannot_be_listed_is_an_error_entry_not_a_500(tmp_path) -> None:
    with gateway(tmp_path / "runtime.json") as gw:
        broken = local("odd", "http://127.0.0.1:9", "odd")
        broken.labels = {"note": "x\udc80"}  # a string that slipped past the checks (a bug): the rest still lists
        gw.call(gw.state.registry.add, broken)
        body = httpx.get(f"{gw.url}/admin/models")
        assert body.status_code == 200
        entry = next(m for m in body.json()["models"] if m["model"] == "odd")["deployments"][0]
        assert entry["state"] == "error" and "vstack deployments rm odd" in entry["error"]
        assert any(m["model"] == "lora-base" for m in body.json()["models"])


def test_an_unreadable_runtime_file_is_moved_aside_not_overwritten(tmp_path) -> None:
    state_file = tmp_path / "runtime.json"
    state_file.write_text('{"version": 1, "deployments": {"kept-by-hand": ')  # cut short
    with gateway(state_file) as gw:
        (skip,) = _runtime(gw)["skipped"]
        assert "unreadable (JSONDecodeError); moved aside to" in skip["why"]
        added = httpx.post(f"{gw.url}/admin/deployments", json={"model_group": "extra", "kind": "local",
                                                               "api_base": "http://127.0.0.1:9"})  # fmt: skip
        assert added.status_code == 201 and "warning" not in added.json()
    (aside,) = tmp_path.glob("runtime.json.unreadable-*")
    assert aside.read_text() == '{"version": 1, "deployments": {"kept-by-hand": '
    assert set(json.loads(state_file.read_text())["deployments"]) == {added.json()["id"]}
