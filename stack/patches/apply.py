"""status / apply / revert / verify of the ledger's patches against one vLLM installation."""

from __future__ import annotations

import importlib.metadata as md
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from stack.patches.diffs import Diff, applies, git_apply
from stack.patches.install import Installation
from stack.patches.ledger import Kind, LoadedLedger, Patch
from stack.patches.tool_errors import PatchError
from stack.patches.txn import Store, sha256

PLUGIN_ENTRY_POINT = "stack.patches.plugin:register"


class State(StrEnum):
    APPLIED = "applied"
    NOT_APPLIED = "not applied"
    UPSTREAM = "already upstream"  # the installed files contain the change and vstack did not apply it
    NOT_NEEDED = "not needed"
    CONFLICT = "conflict"
    DRIFTED = "drifted"  # vstack applied it, then the files changed
    RUNTIME = "runtime"  # a plugin patch: applied inside vLLM processes
    DISABLED = "disabled"


@dataclass(frozen=True)
class Row:
    patch: Patch
    state: State
    detail: str


class Patcher:
    def __init__(self, ledger: LoadedLedger, inst: Installation) -> None:
        self.ledger = ledger
        self.inst = inst
        self.store = Store(inst.site)
        self.notes: list[str] = []

    # -- reading ----------------------------------------------------------------------------------
    def _read(self, diff: Diff, working: dict[str, bytes] | None = None) -> dict[str, bytes]:
        out = {}
        for rel in diff.files:
            if working is not None and rel in working:
                out[rel] = working[rel]
                continue
            try:
                out[rel] = (self.inst.site / rel).read_bytes()
            except FileNotFoundError as e:
                raise PatchError(
                    f"{diff.path.name}: {rel} does not exist in {self.inst.describe()}",
                    hint="the patch targets another vLLM layout; fix its range in the ledger",
                ) from e
        return out

    def _state(self, patch: Patch, applied: dict[str, Any], working: dict[str, bytes] | None = None) -> Row:
        if patch.kind is Kind.PLUGIN:
            return self._plugin_state(patch)
        diff = self.ledger.diffs[patch.id]
        contents = self._read(diff, working)
        shas = {rel: sha256(b) for rel, b in contents.items()}
        record = applied.get(patch.id)
        if record:
            if all(shas[r] == f["after"] for r, f in record["files"].items()):
                return Row(patch, State.APPLIED, f"by vstack on {record['applied_at']}")
            if not all(shas[r] == f["before"] for r, f in record["files"].items()):
                changed = [r for r, f in record["files"].items() if shas[r] != f["after"]]
                return Row(patch, State.DRIFTED, f"changed since vstack applied it: {', '.join(changed)}")
            # Files are back to their originals (vLLM reinstalled): the record is stale, judge afresh.
        if not patch.covers(self.inst.dist, self.inst.version):
            return Row(patch, State.NOT_NEEDED, patch.why_not_needed(self.inst.dist, self.inst.version))
        forward = applies(diff, contents)
        if forward is None:  # why it is not there, and the one command that puts it there
            size = f"{len(diff.files)} file(s), +{diff.added} -{diff.removed}"
            installed = f"{self.inst.dist} {self.inst.version}"
            why = (f"{installed} was reinstalled since vstack applied it on {record['applied_at']}" if record
                   else f"{installed}'s files lack it (installed without `vstack patches apply`)")  # fmt: skip
            return Row(patch, State.NOT_APPLIED, f"{why}; it applies cleanly ({size}): run `vstack patches apply`")
        if applies(diff, contents, reverse=True) is None:
            return Row(patch, State.UPSTREAM, f"{self.inst.dist} {self.inst.version} already contains it")
        return Row(patch, State.CONFLICT, forward)

    def _plugin_state(self, patch: Patch) -> Row:
        if not patch.covers(self.inst.dist, self.inst.version):
            return Row(patch, State.NOT_NEEDED, patch.why_not_needed(self.inst.dist, self.inst.version))
        if not self._entry_point_installed():
            return Row(patch, State.DISABLED, "vllm.general_plugins entry point not installed here")
        return Row(patch, State.RUNTIME, "runs inside vLLM (off: VSTACK_RUNTIME_PATCHES=0)")

    def _entry_point_installed(self) -> bool:
        for dist in md.distributions(path=[str(self.inst.site)]):
            for ep in dist.entry_points:
                if ep.group == "vllm.general_plugins" and ep.value == PLUGIN_ENTRY_POINT:
                    return True
        return False

    def status(self) -> list[Row]:
        applied = self.store.load()["applied"]
        return [self._state(p, applied) for p in self.ledger.patches]

    # -- writing ----------------------------------------------------------------------------------
    def _select(self, ids: list[str] | None, kind: Kind = Kind.SOURCE) -> list[Patch]:
        if not ids:
            return [p for p in self.ledger.patches if p.kind is kind]
        chosen = [self.ledger.get(i) for i in ids]
        for p in chosen:
            if p.kind is not kind:
                raise PatchError(
                    f"{p.id} is a {p.kind} patch: it runs inside vLLM processes, not on files",
                    hint="turn it off with VSTACK_DISABLE_PATCHES=" + p.id,
                )
        return chosen

    def _recover(self) -> None:
        done = self.store.recover()
        if done:
            self.notes.append(f"recovered: {done}")

    def apply(self, ids: list[str] | None = None) -> list[Row]:
        self._recover()
        explicit = bool(ids)
        applied = self.store.load()["applied"]
        working: dict[str, bytes] = {}
        records: dict[str, dict[str, Any]] = {}
        rows, problems = [], []
        for patch in self._select(ids):
            row = self._state(patch, applied, working)
            if row.state is State.NOT_NEEDED and explicit:
                problems.append(
                    f"{patch.id}: refused, {row.detail} (ledger {self.ledger.path})"
                    f"\n    fix: widen applies_to once the diff is checked on {self.inst.version}, or skip it"
                )
            elif row.state in (State.CONFLICT, State.DRIFTED):
                problems.append(f"{patch.id}: {row.state}: {row.detail}")
            elif row.state is State.NOT_APPLIED:
                diff = self.ledger.diffs[patch.id]
                before = self._read(diff, working)
                after = git_apply(diff, before)
                working.update(after)
                records[patch.id] = {
                    "applied_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "patch_sha256": sha256(diff.text.encode()),
                    "files": {
                        r: {"before": sha256(before[r]), "after": sha256(after[r])} for r in diff.files
                    },
                }
                row = Row(patch, State.APPLIED, "applied now")
            rows.append(row)
        if problems:
            raise PatchError(
                "\n".join(problems),
                hint=f"nothing was changed in {self.inst.describe()}; "
                "a conflicting patch must be regenerated against this version (see adr/0004)",
            )
        if working:
            _chain_records(records)

            def update(state: dict[str, Any]) -> None:
                state["applied"].update(records)
                state["installation"] = {"dist": self.inst.dist, "version": str(self.inst.version)}

            self.store.commit("apply", working, update)
        return rows

    def revert(self, ids: list[str] | None = None) -> list[Row]:
        self._recover()
        applied = self.store.load()["applied"]
        working: dict[str, bytes] = {}
        removed: list[str] = []
        rows, problems = [], []
        for patch in reversed(self._select(ids)):
            row = self._state(patch, applied, working)
            if row.state is State.APPLIED:
                diff = self.ledger.diffs[patch.id]
                working.update(git_apply(diff, self._read(diff, working), reverse=True))
                removed.append(patch.id)
                row = Row(patch, State.NOT_APPLIED, "reverted now")
            elif row.state is State.DRIFTED:
                problems.append(f"{patch.id}: {row.detail}")
            rows.append(row)
        if problems:
            raise PatchError(
                "\n".join(problems),
                hint="nothing was changed; `pip install --force-reinstall` vLLM to get pristine files",
            )
        # Files touched by no patch that stays applied must come back byte-identical to the originals.
        staying = {r for pid, rec in applied.items() if pid not in removed for r in rec["files"]}
        for pid in removed:
            for rel, f in applied[pid]["files"].items():
                if rel not in staying and sha256(working[rel]) != f.get("original", f["before"]):
                    raise PatchError(
                        f"revert of {pid} would not restore {rel} exactly", hint="nothing was changed"
                    )
        if working:

            def update(state: dict[str, Any]) -> None:
                for pid in removed:
                    state["applied"].pop(pid, None)

            self.store.commit("revert", working, update)
        return list(reversed(rows))

    def verify(self) -> list[str]:
        """Problems that make this installation differ from what the ledger wants; empty when all is well."""
        problems = []
        if self.store.interrupted():
            problems.append(f"{self.store.journal}: an interrupted transaction (run `vstack patches apply`)")
        for row in self.status():
            p = row.patch
            if row.state in (State.CONFLICT, State.DRIFTED):
                problems.append(f"{p.id}: {row.state}: {row.detail}")
            elif row.state is State.NOT_APPLIED:
                problems.append(f"{p.id}: not applied (run `vstack patches apply`)")
            elif row.state is State.DISABLED:
                problems.append(f"{p.id}: {row.detail} (run `pip install -e .` in the stack's checkout)")
            elif row.state is State.APPLIED:
                diff = self.ledger.diffs[p.id]
                if applies(diff, self._read(diff), reverse=True) is not None:
                    problems.append(f"{p.id}: recorded as applied but its change is not in the files")
        return problems


def _chain_records(records: dict[str, dict[str, Any]]) -> None:
    """Remember each file's original bytes even when two patches in one apply touch it."""
    first: dict[str, str] = {}
    for rec in records.values():
        for rel, f in rec["files"].items():
            f["original"] = first.setdefault(rel, f["before"])
