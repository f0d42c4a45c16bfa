"""The static half of an upgrade check, before any engine starts: serve options and patches on the candidate.

Options: both versions' `vllm serve` parsers, introspected in each side's own Python (stack.vllm.options, cached
per version), compared by the release triage's own diff (stack.patches.triage.options.diff_options) and kept
where a profile sets the option; the profile's rendered command is then parsed by the candidate's parser, as
`vstack up` would on it. Patches: the ledger's states on the candidate's installation (stack.patches.apply), a
patch that no longer applies failing the gate and one already upstream named for removal, then the ledger's
own verify on it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stack.errors import StackError
from stack.patches.apply import Patcher, State
from stack.patches.install import find_installation, site_of_python
from stack.patches.ledger import LoadedLedger
from stack.patches.triage.options import diff_options
from stack.planner.stack_plan import ModelPlan
from stack.vllm.options import VllmCatalog, check_with_vllm


@dataclass
class PatchFinding:
    id: str
    kind: str
    state: str
    detail: str
    blocks: bool  # fails the gate


@dataclass
class PatchTriage:
    installation: str
    patches: list[PatchFinding] = field(default_factory=list)
    verify: list[str] = field(default_factory=list)  # `vstack patches verify` on the candidate
    applied: list[str] = field(default_factory=list)  # source patches the check applied to its own venv

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def catalog_file(cache_dir: Path, catalog: VllmCatalog) -> Path:
    """Where stack.vllm.options.installed_catalog cached this version's parser (the triage's dump format)."""
    return Path(cache_dir) / "vllm-options" / f"{catalog.distribution}-{catalog.version}.json"


def option_changes(cache_dir: Path, pinned: VllmCatalog, candidate: VllmCatalog, plan: ModelPlan
                   ) -> list[dict[str, Any]]:
    """Serve-option changes between the two versions that touch what this profile renders."""
    used = {key: [plan.engine_origins.get(key, f"engine.{key}")] for key in plan.engine}
    changes = diff_options(catalog_file(cache_dir, pinned), catalog_file(cache_dir, candidate), used)
    return [{"option": c.option, "change": c.change, "pinned": c.old, "candidate": c.new, "set_by": c.used_by,
             "migration": c.migration} for c in changes if c.used_by]


def parse_check(plan: ModelPlan, catalog: VllmCatalog, cache_dir: Path) -> str | None:
    """The candidate's own `vllm serve` parser on the profile's rendered command: its error, or None."""
    return check_with_vllm(plan.python, plan.vllm_args(), catalog, cache_dir)


def patch_triage(ledger: LoadedLedger, python: str, own_venv: bool) -> PatchTriage:
    """Each ledger patch on the candidate: a conflict (no longer applies) or drift fails the gate; `already
    upstream` says the patch can be dropped. In a venv the check built (own_venv), the source patches the
    candidate needs are applied first, as `vstack patches apply` would, so verify judges the finished state."""
    try:
        patcher = Patcher(ledger, find_installation(site_of_python(Path(python))))
    except StackError as exc:
        return PatchTriage(python, verify=[exc.message])
    found = PatchTriage(patcher.inst.describe())
    if own_venv and any(r.state is State.NOT_APPLIED for r in patcher.status()):
        try:
            rows = patcher.apply()
            found.applied = [r.patch.id for r in rows if r.state is State.APPLIED]
        except StackError as exc:  # a conflict: nothing was written; the rows below say which patch
            found.verify.append(f"apply: {exc.message.splitlines()[0]}")
    for row in patcher.status():
        detail = row.detail
        if row.state is State.UPSTREAM:
            detail += "; drop it from the ledger (or mark it upstreamed) when this version is pinned"
        found.patches.append(PatchFinding(row.patch.id, str(row.patch.kind), str(row.state), detail,
                                          row.state in (State.CONFLICT, State.DRIFTED)))
    found.verify += patcher.verify()
    return found
