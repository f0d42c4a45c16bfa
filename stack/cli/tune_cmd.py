"""`vstack tune`: the Typer command, with a live table of candidates; thin over stack.tune.run."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from stack.cli.complete import profiles_and_models
from stack.cli.every_command import ConfigOpt, cli_config, run, sigterm_as_interrupt
from stack.errors import ExitCode

out = Console()
err = Console(stderr=True)


def _table(rows: list[list[str]], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("#", "candidate", "state", "result"):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def tune_command(
    config: ConfigOpt = None,
    target: Annotated[str | None, typer.Argument(help="profile or model, as for `vstack up` (default: `serve:`)",
                                                 autocompletion=profiles_and_models)] = None,
    scenario: Annotated[str, typer.Option("--scenario", "-s", help="name in loadtests/scenarios, or a YAML path")
                        ] = "chat",
    slo: Annotated[str | None, typer.Option(help="e.g. 'p95_ttft_ms<800'; default: the scenario's, else the "
                                                 "profile's")] = None,
    sets: Annotated[list[str] | None, typer.Option("--set", help="KEY=V1,V2 engine option values to try "
                                                   "(repeat for a grid; null = vLLM's default)")] = None,
    grid: Annotated[Path | None, typer.Option(help="YAML file: `grid:` (option -> list of values, every combination) "
                                                   "and/or `candidates:` (a list of option mappings)")
                    ] = None,
    baseline: Annotated[bool, typer.Option(help="also measure the profile as it is")] = True,
    mode: Annotated[str | None, typer.Option(help="goodput: highest open-loop request rate meeting the SLO "
                                                  "(default); capacity: the scenario's closed-loop users once")
                    ] = None,
    time_budget: Annotated[float | None, typer.Option("--time-budget", help="seconds this call may take: it "
                                                      "stops cleanly before running out; rerun to resume")
                           ] = None,
    max_candidates: Annotated[int | None, typer.Option(help="without --set/--grid: only the N most promising "
                                                            "knobs for this device (baseline included)")] = None,
    method: Annotated[str, typer.Option(help="vllm-bench (vllm bench serve) or locust")] = "vllm-bench",
    overlap_starts: Annotated[bool | None, typer.Option(
        "--overlap-starts/--no-overlap-starts", help="start the next candidate's engine while the current one is "
        "measured, held before its device (default: on with a GPU, off on a CPU)")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="default: results/tune/PROFILE-SCENARIO")] = None,
    restart: Annotated[bool, typer.Option(help="discard earlier measurements in --out instead of resuming")
                       ] = False,
    stop_on_error: Annotated[bool, typer.Option(help="end the run at the first candidate that fails")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="the outcome as JSON on stdout (progress stays on "
                                          "stderr)")] = False,
    min_match: Annotated[float | None, typer.Option(
        "--min-match", min=0.0, max=1.0, help="quality guard: a candidate that changes numerics and keeps fewer of "
        "the fixed prompts' greedy answers identical to the baseline's is not chosen (default: the scenario's "
        "tune.min_exact_match, 0.5)")] = None,
) -> None:
    """Find the engine settings that serve the most requests within an SLO, by measuring each candidate.

    Starts the engine once per candidate (one at a time), searches the highest open-loop request rate at
    which the SLO holds (goodput), and picks the best candidate, else the closest one (said so). Without
    --set/--grid the candidates are the knobs this device, model and vLLM support. Rerunning resumes.
    """
    from stack.errors import ConfigError
    from stack.hardware import detect, match_profile
    from stack.load.provenance import machine_facts
    from stack.patches.plugin import would_run
    from stack.tune.candidates import Candidate, build_candidates
    from stack.tune.outputs import tuned_profile_name, write_outputs
    from stack.tune.request import TuneEvent, TuneRequest
    from stack.tune.run import overlap_wanted, run_tune

    def body() -> int:
        if method not in ("vllm-bench", "locust"):
            raise ConfigError(f"--method {method!r}: unknown", hint="use vllm-bench or locust")
        if mode not in (None, "goodput", "capacity"):
            raise ConfigError(f"--mode {mode!r}: unknown", hint="use goodput (open-loop rate search) or capacity")
        if time_budget is not None and time_budget <= 0:
            raise ConfigError(f"--time-budget {time_budget:g}: must be > 0 seconds", hint="e.g. --time-budget 480")
        if max_candidates is not None and max_candidates < 1:
            raise ConfigError(f"--max-candidates {max_candidates}: must be >= 1", hint="e.g. --max-candidates 6")
        cfg = cli_config()
        hardware = detect()
        hw_profile, _why = match_profile(hardware, cfg)
        candidates: list[Candidate] | None = None
        if sets or grid:
            candidates = build_candidates(sets or [], grid, hw_profile.accelerator, hw_profile.fp8, baseline)
        name = (target or cfg.serve).replace("/", "-")
        folder = out_dir or Path("results/tune") / f"{name}-{Path(scenario).stem}"
        command = "vstack " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "vstack tune"
        request = TuneRequest(target, scenario, candidates, folder, slo, method, restart, command,  # type: ignore[arg-type]
                              stop_on_error, mode, time_budget, max_candidates, baseline,  # type: ignore[arg-type]
                              overlap_starts, would_run, min_match)
        rows: list[list[str]] = [[str(i + 1), c.label, "waiting", ""] for i, c in enumerate(candidates or [])]
        title = f"vstack tune: scenario {scenario}, results in {folder}"
        err.print("[dim]checking the configuration and the model; candidates: "
                  + (", ".join(c.label for c in candidates) if candidates else "the knobs for this device") + "[/]")
        with Live(_table(rows, title), console=err, refresh_per_second=4) as live:
            def on_event(ev: TuneEvent) -> None:
                while len(rows) < ev.total:
                    rows.append([str(len(rows) + 1), "", "waiting", ""])
                row = rows[ev.index]
                row[1] = ev.candidate.label
                colour = {"reused": "cyan", "done": "green", "failed": "red", "dropped": "red"}.get(ev.phase, "yellow")
                state = ev.phase if ev.phase in ("reused", "done", "failed", "dropped", "paused", "prestarted") \
                    else f"{ev.phase} {ev.elapsed_s:.0f} s"
                row[2] = f"[{colour}]{state}[/]"
                row[3] = ev.detail
                live.update(Group(_table(rows, title), Text(f"{ev.index + 1}/{ev.total}", style="dim")))

            try:  # a `timeout` or Ctrl-C: the tune's cleanup stops its engines; measured candidates are kept
                with sigterm_as_interrupt():
                    outcome = run_tune(cfg, request, hardware, on_event)
            except KeyboardInterrupt:
                outcome = None
        if outcome is None:
            err.print(f"[yellow]interrupted:[/] its engines stopped; measured candidates are in "
                      f"{folder / 'tune-state.json'}: rerun the same command to resume")
            return ExitCode.INTERRUPTED
        files = write_outputs(outcome, folder, machine_facts(), command)
        if as_json:
            return _print_json(outcome, files)
        total = len(rows)
        if outcome.overlap_off and overlap_wanted(request, hardware):  # asked for (or the GPU default), not had
            err.print(f"[yellow]overlapped starts off:[/] {outcome.overlap_off}")
        if outcome.reused:
            out.print(f"[cyan]resumed:[/] {outcome.reused} of {total} candidates measured earlier "
                      f"({folder / 'tune-state.json'})")
        if not outcome.complete:
            out.print(f"[yellow]paused by --time-budget:[/] {outcome.remaining} of {total} candidates left; "
                      "rerun the same command to resume (the pick below is among those measured so far)")
        out.print(Text(files["markdown"].read_text().split("\n| candidate")[0].strip()))
        out.print(Text(_table_only(files["markdown"].read_text())))
        choice = outcome.choice
        if choice.winner is None and not outcome.complete:
            return ExitCode.OK  # nothing finished yet: the next call goes on
        if choice.winner is None:
            err.print(f"[red]{choice.reason}[/]; engine logs in {folder / 'logs'}")
            return ExitCode.ENGINE
        colour = "green" if choice.meets_slo else "yellow"
        out.print(f"[{colour}]{'winner' if choice.meets_slo else 'closest (SLO not met)'}:[/] "
                  f"[bold]{choice.winner.label}[/] - {choice.reason}", highlight=False)
        out.print(f"profile override: {files['profile']}  (use: vstack -c {files['profile']} up "
                  f"{tuned_profile_name(outcome)})")
        return ExitCode.OK if choice.meets_slo else ExitCode.SLO_NOT_MET

    run(body)


def _print_json(outcome: Any, files: dict[str, Path]) -> int:
    """The tune's outcome for scripts; the same exit codes as the tables' path."""
    choice = outcome.choice
    out.print_json(data={
        "complete": outcome.complete, "reused": outcome.reused, "remaining": outcome.remaining,
        "winner": choice.winner.label if choice.winner else None, "meets_slo": choice.meets_slo,
        "reason": choice.reason, "files": {k: str(v) for k, v in files.items()},
    })  # fmt: skip
    if choice.winner is None:
        return ExitCode.OK if not outcome.complete else ExitCode.ENGINE
    return ExitCode.OK if choice.meets_slo else ExitCode.SLO_NOT_MET


def _table_only(markdown: str) -> str:
    """The candidates' table (tune.md's first section; the probes and the rest stay in the file)."""
    return "\n".join(line for line in markdown.split("\n## ")[0].splitlines() if line.startswith("|"))
