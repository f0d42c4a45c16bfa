"""The `vstack patches triage` command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from stack.cli.every_command import command
from stack.patches.ledger import load_ledger
from stack.patches.triage import option_changes as opts
from stack.patches.triage.change_sources import git_range, release_range
from stack.patches.triage.report import (
    TRACKING_FILE,
    build,
    load_decisions,
    to_markdown,
    to_yaml,
    update_tracking,
)
from stack.patches.triage.rules import load_rules

console = Console(stderr=True)


@command
def triage(
    start: Annotated[str, typer.Option("--from", help="baseline: a released version, or a git revision")],
    end: Annotated[str, typer.Option("--to", help="target: a released version, or a git revision")],
    git: Annotated[
        Path | None, typer.Option("--git", help="a vLLM git clone: triage commits in FROM..TO")
    ] = None,
    dist: Annotated[str, typer.Option(help="distribution whose wheels are compared")] = "vllm",
    out: Annotated[Path, typer.Option(help="directory for triage-FROM-TO.md and .yaml")] = Path(
        "patches/triage"
    ),
    rules: Annotated[Path | None, typer.Option(help="rules file (default patches/triage-rules.yaml)")] = None,
    ledger: Annotated[Path | None, typer.Option(help="ledger file (default patches/ledger.yaml)")] = None,
    configs: Annotated[
        Path, typer.Option(help="configs whose engine options are checked")
    ] = opts.CONFIGS_DIR,
    tracking: Annotated[Path, typer.Option(help="tracking file to update")] = TRACKING_FILE,
    no_tracking: Annotated[
        bool, typer.Option("--no-tracking", help="do not write the tracking file")
    ] = False,
) -> None:
    """Classify upstream changes into buckets, judge each tracked patch, list serve-option changes."""
    ruleset = load_rules(rules)
    led = load_ledger(ledger)
    changes = git_range(git, start, end) if git else release_range(dist, start, end)
    old_dump, new_dump = (
        opts.dump_for(start) if not git else None,
        opts.dump_for(end) if not git else None,
    )
    if old_dump and new_dump:
        option_changes, note = opts.diff_options(old_dump, new_dump, opts.used_options(configs)), None
    else:
        option_changes, note = (
            None,
            f"No parser dump for {start} and {end} in {opts.ARGS_DIR}; options not compared.",
        )
    report = build(changes, ruleset, led, option_changes, note, load_decisions(tracking))
    out.mkdir(parents=True, exist_ok=True)
    stem = f"triage-{start}-{end}".replace("/", "_")
    md_path, yaml_path = out / f"{stem}.md", out / f"{stem}.yaml"
    md_path.write_text(to_markdown(report))
    yaml_path.write_text(to_yaml(report))
    if not no_tracking:
        update_tracking(report, [md_path, yaml_path], tracking)
    counts = ", ".join(f"{k} {v}" for k, v in report["counts"].items())
    verdicts = ", ".join(f"{p['id']}: {p['verdict']}" for p in report["patches"])
    used = report["serve_options"]["used_by_our_configs"]
    print(f"{report['dist']} {start} -> {end}: {sum(report['counts'].values())} changes ({counts})")
    print(f"patches: {verdicts}")
    print(f"serve options our configs use that changed: {len(used)}" + (f" ({note})" if note else ""))
    print(f"wrote {md_path} and {yaml_path}" + ("" if no_tracking else f"; updated {tracking}"))
