"""What the console's Plan & config page adds from above the gateway: the patch ledger's state for the vLLM the
engines run, and the latest tune / load reports under results/ (stack.gateway.console.sources says why here)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from stack.config.schema import StackConfig
from stack.errors import StackError
from stack.gateway.console.sources import ConsoleSources

REPORTS = (("tune", "results/tune/*/tune.md"), ("load", "results/load/*/report.md"))
LATEST = 6
TEXT_CHARS = 8000


def patch_state(cfg: StackConfig) -> dict[str, Any]:
    """`vstack patches status --json`, for the engines' Python."""
    from stack.patches.apply import Patcher
    from stack.patches.install import find_installation, site_of_python
    from stack.patches.ledger import load_ledger

    try:
        site = site_of_python(Path(cfg.engine_python)) if cfg.engine_python else None
        p = Patcher(load_ledger(None), find_installation(site))
        rows = [{"id": r.patch.id, "kind": str(r.patch.kind), "state": str(r.state), "detail": r.detail}
                for r in p.status()]  # fmt: skip
    except StackError as exc:
        return {"error": f"{exc.message} ({exc.hint})" if exc.hint else exc.message}
    return {"installation": p.inst.describe(), "patches": rows}


def report_dirs(root: Path) -> list[tuple[str, Path]]:
    """The newest report files (kind, file), newest first."""
    found = [(kind, f) for kind, pattern in REPORTS for f in root.glob(pattern)]
    found.sort(key=lambda kf: kf[1].stat().st_mtime, reverse=True)
    return found[:LATEST]


def reports(root: Path) -> list[dict[str, Any]]:
    out = []
    for i, (kind, f) in enumerate(report_dirs(root)):
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        out.append({"index": i, "kind": kind, "name": f.parent.name, "path": str(f),
                    "modified": f.stat().st_mtime, "text": text[:TEXT_CHARS],
                    "plots": sorted(p.name for p in f.parent.glob("*.png"))})  # fmt: skip
    return out


def console_sources(cfg: StackConfig, root: Path | None = None) -> ConsoleSources:
    root = root or Path.cwd()
    cache: dict[str, Any] = {}

    def patches() -> dict[str, Any]:  # the ledger check reads vLLM's files: at most once a minute
        if cache.get("at", 0) < time.monotonic() - 60:
            cache.update(at=time.monotonic(), value=patch_state(cfg))
        return cache["value"]

    return ConsoleSources(patches=patches, reports=lambda: reports(root),
                          report_dirs=lambda: [f.parent for _, f in report_dirs(root)])  # fmt: skip
