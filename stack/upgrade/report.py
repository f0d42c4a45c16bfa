"""The upgrade check's report: `upgrade-check.json` (everything), `upgrade-check.md` (what a reviewer reads) and
`upgrade-check.png` (each side's probes: offered rate against the SLO's metric, the limit drawn in)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from stack.load.provenance import describe
from stack.upgrade.triage import outcomes_by_patch

JSON_NAME, MD_NAME, PLOT_NAME = "upgrade-check.json", "upgrade-check.md", "upgrade-check.png"


def _num(v: Any, fmt: str = "{:,.3g}") -> str:
    return "–" if v is None else fmt.format(v)


def to_markdown(r: dict[str, Any]) -> str:
    pin, cand, v = r["pinned"], r["candidate"], r["verdict"]
    lines = [f"# Upgrade check: {pin['dist']} {pin['version']} -> {cand['dist']} {cand['version']}", "",
             f"**Verdict: {'PASS' if v['passed'] else 'FAIL'}**"
             + ("" if v["passed"] else f" ({', '.join(v['kinds'])})"),
             "", f"- machine: {describe(r['machine'])}", f"- command: `{r['command']}`" if r.get("command") else "",
             f"- prompts: {len(r['prompts'])} ({', '.join(r['prompts'])}), temperature 0, compared exactly",
             f"- load: scenario `{r['scenario']}`, open-loop rate search {r['search']}" if r.get("search") else
             "- load: not measured (--no-goodput)", f"- took {r['seconds']:.0f} s"]
    if cand.get("built_s"):
        lines.append(f"- candidate venv built in {cand['built_s']:.0f} s ({cand['torch']}), cached at `{cand['venv']}`")
    if cand.get("env") or cand.get("ledger"):
        lines.append(f"- candidate changes: env {cand.get('env')}, ledger {cand.get('ledger')}")
    lines += ["", "## Reasons" if v["reasons"] else "", *[f"- {x}" for x in v["reasons"]]]
    lines += ["", "## Patches on the candidate", "", f"{r['patches']['installation']}", "",
              "| patch | kind | state | detail |", "| --- | --- | --- | --- |"]
    lines += [f"| {p['id']} | {p['kind']} | {p['state']}{' (blocks)' if p['blocks'] else ''} | {p['detail']} |"
              for p in r["patches"]["patches"]]
    if r["patches"]["applied"]:
        lines.append(f"\nApplied to the candidate's venv by the check: {', '.join(r['patches']['applied'])}.")
    verify = "; ".join(r["patches"]["verify"]) or "every needed patch in place"
    lines.append(f"\nLedger verify on the candidate: {verify}")
    if r["patches"].get("runtime"):
        lines += ["", "Runtime patches loaded in the candidate's Python (outside vLLM): "
                  + ", ".join(f"{k}={v}" for k, v in r["patches"]["runtime"].items())]
    for p in r["profiles"]:
        a, b = p["pinned"], p["candidate"]
        lines += ["", f"## Profile `{p['profile']}`: {'pass' if p['verdict']['passed'] else 'FAIL'}", "",
                  f"SLO: {', '.join(p['slo']) or 'none'} ({p['slo_source']})", "",
                  "| | pinned | candidate |", "| --- | --- | --- |",
                  f"| vLLM | {a['vllm']} | {b['vllm']} |",
                  f"| start to ready (s) | {_num(a['startup_s'], '{:.1f}')} | {_num(b['startup_s'], '{:.1f}')} |",
                  f"| goodput at the SLO (req/s) | {_num(a['goodput_rps'])} | {_num(b['goodput_rps'])} |",
                  f"| KV cache, vLLM's own (tokens) | {_num(a['kv_tokens_vllm'], '{:,}')} | "
                  f"{_num(b['kv_tokens_vllm'], '{:,}')} |",
                  f"| KV cache, planner (tokens) | {_num(a['kv_tokens_planner'], '{:,}')} | "
                  f"{_num(b['kv_tokens_planner'], '{:,}')} |"]
        ans = p["answers"]
        if ans:
            lines.append(f"| answers identical | {ans['matched']} of {ans['prompts']} ({ans['by_kind']}) | |")
        for side in (a, b):
            if side.get("error"):
                lines.append(f"\n{side['side']}: {side['error']}")
        if ans and ans["differences"]:
            lines += ["", "| prompt | first diverging token | pinned | candidate |", "| --- | --- | --- | --- |"]
            lines += [f"| {d['id']} | {d['token']} ({d['pinned_token']!r} -> {d['candidate_token']!r}) | "
                      f"{_cell(d['pinned'])} | {_cell(d['candidate'])} |" for d in ans["differences"]]
        if p["option_changes"]:
            lines += ["", "Serve options this profile sets that changed:", ""]
            lines += [f"- `{c['option']}`: {c['change']} ({c['pinned']} -> {c['candidate']}), set by "
                      f"{', '.join(c['set_by'])}" + (f"; {c['migration']}" if c["migration"] else "")
                      for c in p["option_changes"]]
        lines += runtime_table(p.get("runtime_patches") or {})
        for w in p["verdict"]["warnings"]:
            lines.append(f"\nWarning: {w}")
        for side in (a, b):
            if side["goodput_note"]:
                lines.append(f"\n{side['side']} rate search: {side['goodput_note']}")
    return "\n".join(line for line in lines if line is not None) + "\n"


def runtime_table(runtime: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Each runtime patch's outcome in each side's engine processes (stack.upgrade.triage.outcomes_by_patch)."""
    pinned, candidate = (outcomes_by_patch(runtime.get(side) or []) for side in ("pinned", "candidate"))
    if not pinned and not candidate:
        return []
    rows = ["", "Runtime patches in the engines' processes (as each logged them):", "",
            "| patch | pinned | candidate |", "| --- | --- | --- |"]
    def cell(text: str) -> str:  # whole: an outcome's reason is what a reviewer reads
        return text.replace("|", "\\|")

    return rows + [f"| {pid} | {cell(pinned.get(pid, '–'))} | {cell(candidate.get(pid, '–'))} |"
                   for pid in dict.fromkeys([*pinned, *candidate])]


def _cell(text: str) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")[:120]


def plot(r: dict[str, Any], path: Path) -> Path | None:
    """Each profile's probes, both sides; None when matplotlib is not installed (./install.sh --loadtest)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    profiles = [p for p in r["profiles"] if p["pinned"]["points"] or p["candidate"]["points"]]
    if not profiles:
        return None
    fig, axes = plt.subplots(len(profiles), 1, figsize=(8, 4 * len(profiles)), squeeze=False)
    for ax, p in zip(axes[:, 0], profiles, strict=True):
        metric = next((s.split("<")[0] for s in p["slo"] if "_ms<" in s), "p95_ttft_ms")
        for side, color in (("pinned", "tab:blue"), ("candidate", "tab:orange")):
            pts = [q for q in p[side]["points"] if q["rate"] is not None]
            xs = [q["rate"] for q in pts]
            ys = [q["metrics"].get(metric) for q in pts]
            ax.scatter(xs, ys, color=color, label=f"{side} {p[side]['vllm']} (goodput {p[side]['goodput_rps'] or 0:g})",
                       marker="o")
            for q, x, y in zip(pts, xs, ys, strict=True):
                if not q["met"] and y is not None:
                    ax.scatter([x], [y], color=color, marker="x", s=80)
        for s in p["slo"]:
            if s.startswith(metric + "<"):
                ax.axhline(float(s.split("<")[1]), color="red", linewidth=1, label=f"SLO {s}")
        ax.set_xlabel("offered rate (req/s, Poisson)")
        ax.set_ylabel(metric)
        ax.set_title(f"{p['profile']}: {'pass' if p['verdict']['passed'] else 'FAIL'}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if any(isinstance(y, float) and math.isfinite(y) and y > 0 for y in ax.get_ylim()):
            ax.set_ylim(bottom=0)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(r: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {"json": out_dir / JSON_NAME, "markdown": out_dir / MD_NAME}
    written["json"].write_text(json.dumps(r, indent=2, default=str))
    written["markdown"].write_text(to_markdown(r))
    png = plot(r, out_dir / PLOT_NAME)
    if png is not None:
        written["plot"] = png
    return written
