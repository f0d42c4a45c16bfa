"""What `vstack tune` leaves behind: tune.json (everything, every probe of every rate search), tune.md (the
table, the rate -> latency curves, the quality guard, the knobs not tried), goodput_curves.png, and
tuned-profile.yaml (the winner as a profile override, its measurements in comments and description)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from stack.load.provenance import describe
from stack.tune.choose import meets
from stack.tune.request import TuneOutcome

GOODPUT_COLUMNS = (("goodput_rps", "goodput req/s"), ("goodput_output_tokens_per_s", "out tok/s at it"),
                   ("p50_ttft_ms", "TTFT p50"), ("p95_ttft_ms", "TTFT p95"), ("p95_tpot_ms", "TPOT p95"),
                   ("p95_e2e_ms", "E2E p95"), ("probes", "probes"), ("startup_s", "start s"),
                   ("prestart_s", "held s"))
COLUMNS = (("output_tokens_per_s", "out tok/s"), ("requests_per_s", "req/s"), ("p50_ttft_ms", "TTFT p50"),
           ("p95_ttft_ms", "TTFT p95"), ("p95_itl_ms", "ITL p95"), ("p95_e2e_ms", "E2E p95"),
           ("error_rate", "errors"), ("startup_s", "start s"), ("prestart_s", "held s"))


def _num(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, int | float) else str(value)


def tuned_profile_name(outcome: TuneOutcome) -> str:
    return f"{outcome.base.profile.replace('/', '-')}-tuned"


def profile_override(outcome: TuneOutcome, machine: dict[str, Any], command: str) -> str:
    """A config file for `vstack -c FILE up NAME-tuned`: extends the tuned profile when there is one."""
    winner, base = outcome.choice.winner, outcome.base
    assert winner is not None
    x = winner.metrics or {}
    verdict = "meets the SLO" if outcome.choice.meets_slo else "does NOT meet the SLO (closest candidate)"
    at = (f"goodput {_num(x.get('goodput_rps'), 2)} req/s (open loop, SLO held); at that rate: "
          if winner.goodput else "")
    measured = at + (f"{_num(x.get('output_tokens_per_s'))} output tok/s, {_num(x.get('requests_per_s'), 2)} req/s, "
                f"TTFT p50/p95 {_num(x.get('p50_ttft_ms'), 0)}/{_num(x.get('p95_ttft_ms'), 0)} ms, "
                f"ITL p95 {_num(x.get('p95_itl_ms'))} ms, E2E p95 {_num(x.get('p95_e2e_ms'), 0)} ms")
    slo_text = ", ".join(str(c) for c in outcome.clauses) or "none"
    entry: dict[str, Any] = {
        "description": f"{base.profile} tuned by vstack tune on {machine.get('date')} ({verdict}: {slo_text}); "
                       f"{measured}",
    }
    if base.profile in _profile_names(outcome):
        entry["extends"] = base.profile
    else:
        entry["hardware"] = base.hardware.name
        entry["model"] = base.model.name
    entry["engine"] = dict(winner.overrides)
    if outcome.clauses:
        entry["slo"] = [str(c) for c in outcome.clauses]
    q = outcome.quality.get(winner.key)
    header = [
        f"# Written by: {command}",
        f"# Machine: {describe(machine)}",
        f"# Scenario: {outcome.scenario.name} ({outcome.scenario.source}), measured with "
        f"{outcome.fingerprint.get('method')}",
        f"# SLO ({outcome.slo_source}): {slo_text} -> {outcome.choice.winner.label} {verdict}",
        f"# Measured: {measured}",
        f"# Why: {outcome.choice.reason}",
        *([f"# Numerics: {q['numerics']}; quality check: {q['note']}"] if q else []),
        f"# Use: vstack -c THIS_FILE up {tuned_profile_name(outcome)}",
    ]
    body = yaml.safe_dump({"profiles": {tuned_profile_name(outcome): entry}}, sort_keys=False, width=200)
    return "\n".join(header) + "\n" + body


def _profile_names(outcome: TuneOutcome) -> set[str]:
    # The base profile is a configured one unless resolve_profile made up `hardware/model`.
    return set() if "/" in outcome.base.profile else {outcome.base.profile}


def tune_markdown(outcome: TuneOutcome, machine: dict[str, Any], command: str, plot: str | None = None) -> str:
    choice = outcome.choice
    goodput = outcome.mode == "goodput"
    columns = GOODPUT_COLUMNS if goodput else COLUMNS
    how = ("goodput: the highest open-loop request rate (Poisson arrivals unless the scenario sets a "
           "burstiness) at which the SLO held, bisected and the winning rate repeated"
           if goodput else "capacity: the scenario's closed-loop users, one run each")
    lines = [
        f"# vstack tune: {outcome.base.profile}, scenario {outcome.scenario.name}",
        "",
        f"- command: `{command}`",
        f"- machine: {describe(machine)} ({machine.get('host')})",
        f"- mode: {how}",
        f"- measured with: {outcome.fingerprint.get('method')}; SLO ({outcome.slo_source}): "
        f"{', '.join(str(c) for c in outcome.clauses) or 'none'}",
        f"- result: **{choice.winner.label if choice.winner else 'none'}**: {choice.reason}",
        f"- time: {outcome.spent_s:,.0f} s over every call so far"
        + ("" if outcome.complete else f"; **not finished**: {outcome.remaining} candidate(s) left, rerun the "
           "same command to resume"),
        *(["- held s: the part of a candidate's start (vLLM's imports and config, no device memory) done while "
           "the candidate before it was measured; start s is the rest, after the other engine stopped"]
          if any((m.metrics or {}).get("prestart_s") is not None for m in outcome.measured) else []),
        "",
        "| candidate | " + " | ".join(label for _k, label in columns) + " | SLO | numerics | answers vs baseline |",
        "| --- | " + " | ".join("---" for _ in columns) + " | --- | --- | --- |",
    ]
    for m in outcome.measured:
        mark = " (chosen)" if choice.winner and m.key == choice.winner.key else ""
        numerics = m.numerics or "-"
        if not m.ok:
            lines.append(f"| {m.label}{mark} | failed: {m.error} |" + " |" * len(columns)
                         + f" {numerics} | {_answers_cell(outcome.quality.get(m.key))} |")
            continue
        checks = choice.checks.get(m.key, [])
        met = meets(m, checks)
        lost = [f"{m.dropped} requests failed"] if m.dropped else []
        verdict = "-" if not checks and not lost else "pass" if met else \
            "fail: " + (", ".join(lost + [str(r.clause) for r in checks if not r.met]) or "no rate met it")
        cells = [_num((m.metrics or {}).get(k), 3 if k == "error_rate" else 2 if k == "goodput_rps" else 1)
                 for k, _label in columns]
        lines.append(f"| {m.label}{mark} | " + " | ".join(cells)
                     + f" | {verdict} | {numerics} | {_answers_cell(outcome.quality.get(m.key))} |")
    if goodput:
        lines += ["", "## Rate search (every probe; warm-up requests excluded)", "",
                  "| candidate | offered req/s | role | requests | achieved req/s | TTFT p50 | TTFT p95 | TPOT p50 | "
                  "TPOT p95 | E2E p50 | E2E p95 | SLO |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for m in outcome.measured:
            for p in m.points or []:
                x = p.get("metrics") or {}
                rate = "all at once" if p.get("rate") is None else f"{p['rate']:g}"
                cells = [_num(x.get(f"p{q}_{n}_ms")) for n in ("ttft", "tpot", "e2e") for q in (50, 95)]
                achieved = _num(x.get("requests_per_s"), 2)
                lines.append(f"| {m.label} | {rate} | {p['role']} | {p['requests']} | {achieved} | "
                             + " | ".join(cells) + f" | {'meets' if p['met'] else 'misses'} |")
        if plot:
            lines += ["", f"![offered rate -> latency]({plot})"]
    if outcome.quality:
        lines += ["", "## Quality guard (candidates that change numerics)", ""]
        for key, q in outcome.quality.items():
            label = next((m.label for m in outcome.measured if m.key == key), key)
            rate = "" if q["exact_match"] is None else f" (exact match {q['exact_match']:.0%})"
            lines.append(f"- {label}: {q['numerics']}: {q['note']}{rate}")
            for d in q.get("first_divergence") or []:
                where = "-" if d["token"] is None else f"token {d['token']}: {d['baseline']!r} -> {d['candidate']!r}"
                lines.append(f"  - {d['prompt'].splitlines()[0]!r}: parts at {where}")
    if outcome.skipped:
        lines += ["", "## Not tried", ""] + [f"- {k.label}: {k.reason}" for k in outcome.skipped]
    return "\n".join(lines) + "\n"


def _answers_cell(q: dict[str, Any] | None) -> str:
    """The quality column: answers identical to the baseline's, the earliest diverging token, the verdict."""
    if not q:
        return "-"
    if q.get("exact_match") is None:
        return q["note"].split(":")[0]
    text = f"{q['matched']}/{q['prompts']} identical"
    if q.get("earliest_divergence") is not None:
        text += f", first parts at token {q['earliest_divergence']}"
    return text + (" (below the floor: not chosen)" if q.get("below") else "")


def write_outputs(outcome: TuneOutcome, out_dir: Path, machine: dict[str, Any], command: str) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": out_dir / "tune.json", "markdown": out_dir / "tune.md"}
    choice = outcome.choice
    curves = {m.label: m.points for m in outcome.measured if m.points}
    if curves:
        from stack.load.plots import goodput_plot

        files["plot"] = goodput_plot(curves, outcome.clauses, out_dir / "goodput_curves.png",
                                     f"{outcome.base.profile}: offered rate -> latency ({machine.get('date')})")
    data = {
        "command": command, "machine": machine, "scenario": outcome.scenario.name,
        "profile": outcome.base.profile, "method": outcome.fingerprint.get("method"),
        "mode": outcome.mode, "complete": outcome.complete, "remaining": outcome.remaining,
        "spent_s": round(outcome.spent_s, 1),
        "slo": {"source": outcome.slo_source, "clauses": [str(c) for c in outcome.clauses]},
        "quality_floor": next((q["min_match"] for q in outcome.quality.values() if "min_match" in q), None),
        "choice": {"winner": choice.winner.label if choice.winner else None,
                   "overrides": choice.winner.overrides if choice.winner else None,
                   "meets_slo": choice.meets_slo, "reason": choice.reason},
        "candidates": [{"label": m.label, "key": m.key, "overrides": m.overrides, "metrics": m.metrics,
                        "error": m.error, "numerics": m.numerics, "points": m.points,
                        "quality": outcome.quality.get(m.key),
                        "slo": [r.describe() for r in choice.checks.get(m.key, [])]} for m in outcome.measured],
        "not_tried": [{"label": k.label, "reason": k.reason} for k in outcome.skipped],
        "fingerprint": outcome.fingerprint,
    }
    files["json"].write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
    files["markdown"].write_text(tune_markdown(outcome, machine, command, files["plot"].name if curves else None))
    if choice.winner:
        files["profile"] = out_dir / "tuned-profile.yaml"
        files["profile"].write_text(profile_override(outcome, machine, command))
    return files


def _json_default(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else str(value)
