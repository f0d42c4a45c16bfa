"""What `vstack tune` leaves behind: tune.json (everything), tune.md (the table), tuned-profile.yaml
(the winner as a profile override, its measurements in comments and description)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from stack.load.machine import describe
from stack.load.tune import TuneOutcome

COLUMNS = (("output_tokens_per_s", "out tok/s"), ("requests_per_s", "req/s"), ("p50_ttft_ms", "TTFT p50"),
           ("p95_ttft_ms", "TTFT p95"), ("p95_itl_ms", "ITL p95"), ("p95_e2e_ms", "E2E p95"),
           ("error_rate", "errors"), ("startup_s", "start s"))


def _num(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, int | float) else str(value)


def tuned_profile_name(outcome: TuneOutcome) -> str:
    return f"{outcome.base.resolved.name.replace('/', '-')}-tuned"


def profile_override(outcome: TuneOutcome, machine: dict[str, Any], command: str) -> str:
    """A config file for `vstack -c FILE up NAME-tuned`: extends the tuned profile when there is one."""
    winner, resolved = outcome.choice.winner, outcome.base.resolved
    assert winner is not None
    x = winner.metrics or {}
    verdict = "meets the SLO" if outcome.choice.meets_slo else "does NOT meet the SLO (closest candidate)"
    measured = (f"{_num(x.get('output_tokens_per_s'))} output tok/s, {_num(x.get('requests_per_s'), 2)} req/s, "
                f"TTFT p50/p95 {_num(x.get('p50_ttft_ms'), 0)}/{_num(x.get('p95_ttft_ms'), 0)} ms, "
                f"ITL p95 {_num(x.get('p95_itl_ms'))} ms, E2E p95 {_num(x.get('p95_e2e_ms'), 0)} ms")
    slo_text = ", ".join(str(c) for c in outcome.clauses) or "none"
    entry: dict[str, Any] = {
        "description": f"{resolved.name} tuned by vstack tune on {machine.get('date')} ({verdict}: {slo_text}); "
                       f"{measured}",
    }
    if resolved.name in _profile_names(outcome):
        entry["extends"] = resolved.name
    else:
        entry["hardware"] = resolved.hardware.name
        entry["model"] = resolved.model.name
    entry["engine"] = dict(winner.overrides)
    if outcome.clauses:
        entry["slo"] = [str(c) for c in outcome.clauses]
    header = [
        f"# Written by: {command}",
        f"# Machine: {describe(machine)}",
        f"# Scenario: {outcome.scenario.name} ({outcome.scenario.source}), measured with "
        f"{outcome.fingerprint.get('method')}",
        f"# SLO ({outcome.slo_source}): {slo_text} -> {outcome.choice.winner.label} {verdict}",
        f"# Measured: {measured}",
        f"# Why: {outcome.choice.reason}",
        f"# Use: vstack -c THIS_FILE up {tuned_profile_name(outcome)}",
    ]
    body = yaml.safe_dump({"profiles": {tuned_profile_name(outcome): entry}}, sort_keys=False, width=200)
    return "\n".join(header) + "\n" + body


def _profile_names(outcome: TuneOutcome) -> set[str]:
    # The base profile is a configured one unless resolve_profile made up `hardware/model`.
    return set() if "/" in outcome.base.resolved.name else {outcome.base.resolved.name}


def tune_markdown(outcome: TuneOutcome, machine: dict[str, Any], command: str) -> str:
    choice = outcome.choice
    lines = [
        f"# vstack tune: {outcome.base.resolved.name}, scenario {outcome.scenario.name}",
        "",
        f"- command: `{command}`",
        f"- machine: {describe(machine)} ({machine.get('host')})",
        f"- measured with: {outcome.fingerprint.get('method')}; SLO ({outcome.slo_source}): "
        f"{', '.join(str(c) for c in outcome.clauses) or 'none'}",
        f"- result: **{choice.winner.label if choice.winner else 'none'}**: {choice.reason}",
        "",
        "| candidate | " + " | ".join(label for _k, label in COLUMNS) + " | SLO |",
        "| --- | " + " | ".join("---" for _ in COLUMNS) + " | --- |",
    ]
    for m in outcome.measured:
        mark = " (chosen)" if choice.winner and m.key == choice.winner.key else ""
        if not m.ok:
            lines.append(f"| {m.label}{mark} | failed: {m.error} |" + " |" * len(COLUMNS))
            continue
        checks = choice.checks.get(m.key, [])
        verdict = "-" if not checks else ("pass" if all(r.met for r in checks) else
                                          "fail: " + ", ".join(str(r.clause) for r in checks if not r.met))
        cells = [_num((m.metrics or {}).get(k), 3 if k == "error_rate" else 1) for k, _label in COLUMNS]
        lines.append(f"| {m.label}{mark} | " + " | ".join(cells) + f" | {verdict} |")
    return "\n".join(lines) + "\n"


def write_outputs(outcome: TuneOutcome, out_dir: Path, machine: dict[str, Any], command: str) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": out_dir / "tune.json", "markdown": out_dir / "tune.md"}
    choice = outcome.choice
    data = {
        "command": command, "machine": machine, "scenario": outcome.scenario.name,
        "profile": outcome.base.resolved.name, "method": outcome.fingerprint.get("method"),
        "slo": {"source": outcome.slo_source, "clauses": [str(c) for c in outcome.clauses]},
        "choice": {"winner": choice.winner.label if choice.winner else None,
                   "overrides": choice.winner.overrides if choice.winner else None,
                   "meets_slo": choice.meets_slo, "reason": choice.reason},
        "candidates": [{"label": m.label, "key": m.key, "overrides": m.overrides, "metrics": m.metrics,
                        "error": m.error,
                        "slo": [r.describe() for r in choice.checks.get(m.key, [])]} for m in outcome.measured],
        "fingerprint": outcome.fingerprint,
    }
    files["json"].write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
    files["markdown"].write_text(tune_markdown(outcome, machine, command))
    if choice.winner:
        files["profile"] = out_dir / "tuned-profile.yaml"
        files["profile"].write_text(profile_override(outcome, machine, command))
    return files


def _json_default(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else str(value)
