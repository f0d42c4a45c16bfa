"""What the Plan & config page shows, computed by the layers above the gateway and handed in as callables.

The gateway cannot import the planner's composition root, the patch ledger or the load reports (the import
layers, adr/0010): stack.assemble fills `config` and `engines` from the planned stack, the CLI's entry points
`patches` and `reports` (stack.cli.console_sources). Each returns JSON-ready data, redacted already.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class ConsoleSources:
    config: Callable[[], dict[str, Any]] | None = None  # the effective configuration, secrets masked
    engines: Callable[[], list[dict[str, Any]]] | None = None  # each model: fit, reasons, `vllm serve` line
    patches: Callable[[], dict[str, Any]] | None = None  # the patch ledger's state for the installed vLLM
    reports: Callable[[], list[dict[str, Any]]] | None = None  # the latest tune / load reports
    report_dirs: Callable[[], list[Path]] | None = None  # where their plots may be read from
    bus_h2d_gbps: float | None = None  # host -> GPU copies (stack.manager.tiers.bus_for): a wake's floor


def with_bus_floor(switch: dict[str, Any], h2d_gbps: float | None) -> dict[str, Any]:
    """A wake from sleep next to the time its weights alone take over the bus (None: a cold start, or no GPU)."""
    weights = switch.get("weights_gib")
    if switch.get("kind") != "sleeping" or not weights or not h2d_gbps:
        return {**switch, "bus_floor_s": None, "bus_gbps": h2d_gbps}
    return {**switch, "bus_floor_s": round(weights * 2**30 / (h2d_gbps * 1e9), 3), "bus_gbps": h2d_gbps}
