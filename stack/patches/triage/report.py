"""Build the triage report (markdown and YAML) and update the tracking file."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

from stack.patches.diffs import applies
from stack.patches.ledger import Kind, LoadedLedger, Status
from stack.patches.triage.change_sources import Changes, Side
from stack.patches.triage.option_changes import OptionChange
from stack.patches.triage.rules import Bucket, Change, RuleSet

TRACKING_FILE = Path(__file__).resolve().parents[3] / "patches" / "tracking.yaml"


def patch_verdicts(ledger: LoadedLedger, changes: Changes) -> list[dict[str, Any]]:
    """For each tracked active patch: does the target make it needless, break it, or still need it?"""
    out = []
    try:
        target_version: Version | None = Version(changes.target.version)
    except InvalidVersion:
        target_version = None  # a git revision, not a release
    for p in ledger.patches:
        if p.status is not Status.ACTIVE:
            continue
        row: dict[str, Any] = {"id": p.id, "kind": str(p.kind), "upstream": p.upstream.cite()}
        if target_version is not None:
            in_range = any(p.covers(d, target_version) for d in p.applies_to)
            row["range"] = "covers target" if in_range else "target outside applies_to"
        if p.kind is Kind.PLUGIN:
            row["verdict"] = "review"
            row["detail"] = "runtime patch: check that its target still exists and is still needed"
        else:
            row.update(_source_verdict(ledger, p.id, changes.target))
        out.append(row)
    return out


def _source_verdict(ledger: LoadedLedger, pid: str, target: Side) -> dict[str, str]:
    diff = ledger.diffs[pid]
    contents = {rel: target.read(rel) for rel in diff.files}
    missing = [rel for rel, data in contents.items() if data is None]
    if missing:
        return {"verdict": "breaks", "detail": f"target has no {', '.join(missing)}: rewrite the patch"}
    files = {rel: data for rel, data in contents.items() if data is not None}
    if applies(diff, files, reverse=True) is None:
        return {
            "verdict": "needless",
            "detail": "target already contains it: mark upstreamed, drop on upgrade",
        }
    reason = applies(diff, files)
    if reason is None:
        return {"verdict": "still needed", "detail": "applies cleanly to the target"}
    return {"verdict": "breaks", "detail": f"does not apply to the target ({reason}): regenerate"}


def build(
    changes: Changes,
    rules: RuleSet,
    ledger: LoadedLedger,
    options: list[OptionChange] | None,
    options_note: str | None = None,
    decisions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    buckets: dict[str, list[dict[str, Any]]] = {b.value: [] for b in Bucket}
    for c in changes.changes:
        rule = rules.classify(c)
        item: dict[str, Any] = {"ref": c.ref, "title": c.title, "rule": rule.id, "why": rule.why}
        if decided := _decided(c, decisions or []):
            item["decided"] = decided
        if c.tags:
            item["tags"] = c.tags
        if c.prs:
            item["prs"] = c.prs
        if c.size:
            item["lines"] = c.size
        if changes.source == "git":
            item["paths"] = c.paths
        buckets[rule.bucket.value].append(item)
    used = [asdict(o) for o in options or [] if o.used_by]
    return {
        "source": changes.source,
        "dist": changes.dist,
        "baseline": {"version": changes.baseline.version, "commit": changes.baseline.commit},
        "target": {"version": changes.target.version, "commit": changes.target.commit},
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "counts": {b: len(items) for b, items in buckets.items()},
        "buckets": buckets,
        "patches": patch_verdicts(ledger, changes),
        "serve_options": {
            "note": options_note,
            "used_by_our_configs": used,
            "all": [asdict(o) for o in options or []],
        },
    }


def _decided(c: Change, decisions: list[dict[str, Any]]) -> str | None:
    """An earlier decision (tracking file) that names this change by path, commit or PR: not triaged twice."""
    keys = [c.ref, *(f"#{n}" for n in c.prs)]
    for d in decisions:
        text = str(d.get("change", ""))
        if any(k and k in text for k in keys):
            return f"{d.get('decision')}: {d.get('reason', '')}"
    return None


def load_decisions(path: Path = TRACKING_FILE) -> list[dict[str, Any]]:
    try:
        return list((yaml.safe_load(path.read_text()) or {}).get("decisions") or [])
    except FileNotFoundError:
        return []


def to_yaml(report: dict[str, Any]) -> str:
    return yaml.safe_dump(report, sort_keys=False, width=110, allow_unicode=True)


def to_markdown(report: dict[str, Any], *, per_bucket_limit: int = 60) -> str:
    b, t = report["baseline"], report["target"]
    md = [
        f"# Upstream triage: {report['dist']} {b['version']} -> {t['version']}",
        "",
        f"Source: {report['source']}; baseline commit `{b['commit']}`, target commit `{t['commit']}`; "
        f"generated {report['generated']}.",
        "",
        "| bucket | changes |",
        "| --- | ---: |",
        *(f"| {k} | {v} |" for k, v in report["counts"].items()),
        "",
        "## Tracked patches",
        "",
        "| patch | kind | upstream | verdict | detail |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| {p['id']} | {p['kind']} | {p['upstream']} | **{p['verdict']}** | {p['detail']} |"
            for p in report["patches"]
        ),
        "",
        "## Serve options our configs use",
        "",
    ]
    used = report["serve_options"]["used_by_our_configs"]
    if report["serve_options"]["note"]:
        md += [report["serve_options"]["note"], ""]
    elif not used:
        md += ["No option that configs/ sets changed.", ""]
    else:
        md += [
            "| option | change | old | new | used by | migration |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        md += [
            f"| {o['option']} | {o['change']} | `{o['old']}` | `{o['new']}` | {', '.join(o['used_by'])} "
            f"| {o['migration'] or ''} |"
            for o in used
        ]
        md.append("")
    others = [o for o in report["serve_options"]["all"] if not o["used_by"] and o["change"] != "added"]
    added = [o for o in report["serve_options"]["all"] if o["change"] == "added"]
    if others or added:
        md += [
            f"Other option changes: {len(others)} (removed/renamed/default/choices/flags), "
            f"{len(added)} added; "
            "see the YAML report.",
            "",
        ]
    for bucket, items in report["buckets"].items():
        md += [f"## {bucket} ({len(items)})", ""]
        for it in items[:per_bucket_limit]:
            prs = " ".join(f"#{n}" for n in it.get("prs", []))
            done = f" — **decided earlier**: {it['decided']}" if "decided" in it else ""
            md.append(
                f"- `{it['ref']}` {it['title']}{' (' + prs + ')' if prs else ''} — _{it['rule']}_{done}"
            )
        if len(items) > per_bucket_limit:
            md.append(f"- … {len(items) - per_bucket_limit} more in the YAML report")
        md.append("")
    return "\n".join(md)


def update_tracking(report: dict[str, Any], report_paths: list[Path], path: Path = TRACKING_FILE) -> None:
    """Record baseline/target (and commits); keep the hand-kept `decisions` untouched."""
    try:
        current = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        current = {}
    tracking = {
        "baseline": {"dist": report["dist"], **report["baseline"]},
        "target": {"dist": report["dist"], **report["target"]},
        "source": report["source"],
        "triaged": report["generated"],
        "counts": report["counts"],
        "patches": {p["id"]: p["verdict"] for p in report["patches"]},
        "reports": [str(p) for p in report_paths],
        "decisions": current.get("decisions", []),
    }
    header = (
        "# Upstream tracking: written by `vstack patches triage` (baseline, target, counts, verdicts).\n"
        "# `decisions` is kept by hand and never rewritten: ported / deferred / skipped changes with\n"
        "# their reason, so nothing is triaged twice.\n"
    )
    path.write_text(header + yaml.safe_dump(tracking, sort_keys=False, width=110))
