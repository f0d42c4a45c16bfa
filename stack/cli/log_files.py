"""The log files `vstack up` writes under state_dir/logs: the gateway's own and one per engine (by the model
it serves). Read by `vstack logs` and by its shell completion."""

from __future__ import annotations

from pathlib import Path

GATEWAY_LOG = "gateway.log"


def engine_logs(folder: Path) -> dict[str, Path]:
    """Each engine log under `folder` by the model it serves (served names may hold a slash: Hub ids)."""
    return {str(p.relative_to(folder).with_suffix("")): p for p in sorted(folder.rglob("*.log"))
            if p.name != GATEWAY_LOG}  # fmt: skip
