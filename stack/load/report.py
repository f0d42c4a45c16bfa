"""The SLO report of a load run: report.json, report.md and PNG plots, next to Locust's CSV and HTML."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stack.config.slo import LATENCIES, Clause, all_met, evaluate
from stack.load.measured_requests import RequestRecord
from stack.load.plots import latency_plot, throughput_plot
from stack.load.scenario import Scenario
from stack.load.summary import by_model, errors_by_kind, over_time, summarize

LABELS = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2e": "E2E"}


def _clean(value: Any) -> Any:
    """NaN is not JSON: None instead (a metric with no samples)."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 3)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def build_report(
    records: list[RequestRecord],
    scenario: Scenario,
    clauses: list[Clause],
    slo_source: str,
    target: str,
    machine: dict[str, Any],
    out_dir: Path,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Compute everything, draw the plots, write report.json and report.md; returns the JSON data."""
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = summarize(records)
    results = evaluate(clauses, metrics)
    windows = over_time(records)
    title = f"{scenario.name} against {target} ({machine.get('date')})"
    plots = {}
    if windows:
        plots["latency"] = latency_plot(windows, clauses, out_dir / "latency_over_time.png", title).name
        plots["throughput"] = throughput_plot(windows, out_dir / "throughput_over_time.png", title).name
    data = {
        "scenario": scenario.name,
        "scenario_file": scenario.source,
        "target": target,
        "machine": machine,
        "slo": {"source": slo_source, "passed": all_met(results) if clauses else None,
                "clauses": [{"clause": str(r.clause), "value": r.value, "met": r.met} for r in results]},
        "metrics": metrics,
        "by_model": by_model(records),
        "errors": [{"error": e, "count": n} for e, n in errors_by_kind(records)],
        "over_time": [asdict(w) for w in windows],
        "plots": plots,
        **(extra or {}),
    }
    data = _clean(data)
    (out_dir / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    (out_dir / "report.md").write_text(render_markdown(data))
    return data


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def render_markdown(data: dict[str, Any]) -> str:
    m, slo, machine = data["metrics"], data["slo"], data["machine"]
    verdict = {True: "**PASS**", False: "**FAIL**", None: "no SLO given"}[slo["passed"]]
    lines = [
        f"# Load report: {data['scenario']}",
        "",
        f"- target: `{data['target']}`; scenario file: `{data['scenario_file']}`",
        f"- machine: {machine.get('host')}, {machine.get('cpu')} ({machine.get('cpu_cores')} cores), "
        f"GPUs: {', '.join(machine.get('gpus') or []) or 'none'}; {machine.get('vllm')}; {machine.get('time_utc')}",
        f"- {m['requests']} requests in {m['duration_s']} s: {m['ok']} ok, {m['errors']} failed "
        f"(error rate {(m['error_rate'] or 0):.2%})",
        f"- throughput: **{(m['output_tokens_per_s'] or 0):,.1f} output tokens/s**, "
        f"{(m['requests_per_s'] or 0):,.2f} requests/s; mean prompt {(m['prompt_tokens_mean'] or 0):,.0f} tokens, "
        f"mean output {(m['output_tokens_mean'] or 0):,.0f} tokens",
        "",
        f"## SLO: {verdict}",
        "",
    ]
    if slo["clauses"]:
        lines += [f"from {slo['source']}", "", "| objective | measured | result |", "| --- | --- | --- |"]
        for c in slo["clauses"]:
            shown = "not measured" if c["value"] is None else f"{c['value']:,.4g}"
            lines.append(f"| `{c['clause']}` | {shown} | {'pass' if c['met'] else '**FAIL**'} |")
        lines.append("")
    lines += ["## Latency (ms)", "", "| metric | p50 | p90 | p95 | p99 | mean |",
              "| --- | --- | --- | --- | --- | --- |"]
    for name in LATENCIES:
        cells = [_ms(m.get(f"p{p}_{name}_ms")) for p in (50, 90, 95, 99)] + [_ms(m.get(f"mean_{name}_ms"))]
        lines.append(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    lines += ["", "TTFT and ITL come from streamed requests; TPOT = (E2E - TTFT) / (output tokens - 1).", ""]
    if len(data["by_model"]) > 1:
        lines += ["## By model", "", "| model | requests | errors | output tok/s | p95 TTFT | p95 E2E |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for model, s in data["by_model"].items():
            lines.append(f"| {model} | {s['requests']} | {s['errors']} | {(s['output_tokens_per_s'] or 0):,.1f} | "
                         f"{_ms(s['p95_ttft_ms'])} | {_ms(s['p95_e2e_ms'])} |")
        lines.append("")
    if data["errors"]:
        lines += ["## Errors", ""] + [f"- {e['count']} x {e['error']}" for e in data["errors"]] + [""]
    if data["plots"]:
        lines += ["## Over time", ""] + [f"![{k}]({v})" for k, v in data["plots"].items()] + [""]
    files = data.get("files")
    if files:
        lines += ["## Files", ""] + [f"- {k}: `{v}`" for k, v in files.items()] + [""]
    return "\n".join(lines)
