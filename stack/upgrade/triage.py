"""The static half of an upgrade check, before any engine starts: serve options and patches on the candidate.

Options: both versions' `vllm serve` parsers, introspected in each side's own Python (stack.vllm.options, cached
per version), compared by the release triage's own diff (stack.patches.triage.option_changes.diff_options) and kept
where a profile sets the option; the profile's rendered command is then parsed by the candidate's parser, as
`vstack up` would on it. Patches: the ledger's states on the candidate's installation (stack.patches.apply), a
patch that no longer applies failing the gate and one already upstream named for removal, then the ledger's
own verify on it. Runtime (plugin) patches are then loaded in a child of the candidate's Python as a vLLM
process loads them (`plugin_load`): one that raises fails the gate, as does the line the engine logs when a
patch failed in any of its processes ("... failed, vLLM runs unpatched", `unpatched_in_log`). Every runtime
patch's outcome (applied / not needed / failed) is kept: the probe's, and each engine process's own from the
line the plugin logs there (`runtime_outcomes_in_log`), since a patch that needs CUDA or an engine's variables
says "not needed" in a bare Python and "applied" only inside the engine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stack.errors import StackError
from stack.patches.apply import Patcher, State
from stack.patches.install import find_installation, site_of_python
from stack.patches.ledger import LEDGER_ENV, LoadedLedger
from stack.patches.triage.option_changes import diff_options
from stack.planner.plans import ModelPlan
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
    runtime: dict[str, str] = field(default_factory=dict)  # runtime patch id -> outcome in the candidate's probe

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


UNPATCHED = "failed, vLLM runs unpatched"  # stack.patches.plugin's warning, in any vLLM process's log
STACK_ROOT = Path(__file__).resolve().parents[2]


def plugin_load(python: str, ledger: Path | None, timeout_s: float = 300
                ) -> tuple[list[PatchFinding], dict[str, str]]:
    """The ledger's runtime patches loaded in a fresh `python` (the candidate's) as a vLLM process would load
    them: a finding that blocks for each patch that fails (or for a ledger that does not load there), and every
    patch's outcome there (id -> "applied", "not needed (why)", "failed: ...")."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(STACK_ROOT), os.environ.get("PYTHONPATH")]))}
    if ledger is not None:
        env[LEDGER_ENV] = str(Path(ledger).resolve())
    code = "from stack.patches.plugin import probe; probe()"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout_s, env=env)
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        tail = getattr(exc, "stderr", None) or (done.stderr if "done" in locals() else "")
        return [PatchFinding("runtime-patches", "plugin", "not loaded", f"the runtime patches could not be loaded "
                             f"in {python}: {type(exc).__name__}; {str(tail)[-300:]}", True)], {}  # fmt: skip
    found = []
    if answer.get("ledger_error"):
        found.append(PatchFinding("ledger", "plugin", "not loaded", f"the candidate's ledger does not load: "
                                  f"{answer['ledger_error']}; vLLM would run unpatched", True))  # fmt: skip
    outcomes = {str(k): str(v) for k, v in (answer.get("outcomes") or {}).items()}
    for patch_id, outcome in outcomes.items():
        if outcome.startswith("failed"):
            found.append(PatchFinding(patch_id, "plugin", "fails to load", f"{outcome}; vLLM runs unpatched", True))
    return found, outcomes


def unpatched_in_log(log: Path | str) -> list[str]:
    """The engine log's lines that say a runtime patch failed in one of its processes (the gate fails on each)."""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return []
    return [line.strip()[-300:] for line in text.splitlines() if UNPATCHED in line]


# stack.patches.plugin.register's line, once per vLLM process: "(EngineCore pid=855) INFO ... vstack runtime
# patches for vllm 0.26.0: a=applied, b=not needed (why, maybe with commas)"; the API server's has no prefix.
OUTCOMES_LINE = re.compile(r"^(?:\((?P<process>[^)]*?)(?: pid=\d+)?\)\s+)?.*vstack runtime patches for "
                           r"(?P<vllm>\S+ \S+): (?P<outcomes>.*)$")
NEXT_PATCH = re.compile(r", (?=[a-z0-9][a-z0-9.-]*=)")  # a ledger id (its schema's pattern) then `=`


def runtime_outcomes_in_log(log: Path | str, since: int = 0) -> list[dict[str, Any]]:
    """Each vLLM process's runtime patch outcomes, from the line the plugin logs in it: [{"process": "EngineCore",
    "vllm": "vllm 0.26.0", "outcomes": {id: outcome}}]. Empty: no process logged one (the plugin did not load)."""
    try:
        with Path(log).open("rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        m = OUTCOMES_LINE.match(line.strip())
        if m is None:
            continue
        outcomes = {}
        for item in NEXT_PATCH.split(m["outcomes"].strip()):
            key, sep, value = item.partition("=")
            if sep:
                outcomes[key] = value
        found.append({"process": m["process"] or "APIServer", "vllm": m["vllm"], "outcomes": outcomes})
    return found


def outcomes_by_patch(processes: list[dict[str, Any]]) -> dict[str, str]:
    """One cell per patch for the report: each outcome with the processes that had it ("applied in APIServer,
    EngineCore"), so a patch applied in one process and not needed in another says both."""
    cells: dict[str, dict[str, list[str]]] = {}
    for proc in processes:
        for patch_id, outcome in proc["outcomes"].items():
            cells.setdefault(patch_id, {}).setdefault(outcome, []).append(proc["process"])
    return {pid: "; ".join(f"{o} in {', '.join(dict.fromkeys(ps))}" for o, ps in by.items())
            for pid, by in cells.items()}
