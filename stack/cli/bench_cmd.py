"""`vstack bench load` and `vstack bench scenarios`: Typer commands, thin over stack.load.load."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from stack.cli.shell import ConfigOpt, cli_config, run
from stack.errors import ExitCode, StackError

app = typer.Typer(help="Load tests with SLO reports (Locust), and the scenarios they run.", no_args_is_help=True)
out = Console()
err = Console(stderr=True)


@app.command("load")
def load(
    config: ConfigOpt = None,
    scenario: Annotated[str, typer.Option("--scenario", "-s", help="name in stack/load/scenarios, or a YAML path")
                        ] = "chat",
    duration: Annotated[float | None, typer.Option(help="seconds; default: the scenario's")] = None,
    url: Annotated[str | None, typer.Option(help="OpenAI base URL without /v1; default: the gateway, "
                                                 "else the engine `vstack up` started")] = None,
    slo: Annotated[str | None, typer.Option(help="e.g. 'p95_e2e_ms<800, output_tokens_per_s>=50'; default: "
                                                 "the scenario's, else the profile's")] = None,
    profile: Annotated[str | None, typer.Option(help="whose `slo:` applies when neither --slo nor the "
                                                     "scenario sets one")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="default: results/load/NAME-TIME")] = None,
) -> None:
    """Run a scenario with Locust (headless), then write the SLO report: markdown, JSON and PNG plots."""
    from stack.load.load import check_duration, find_target, run_load

    def body() -> int:
        check_duration(duration)
        cfg = cli_config()
        base = url.rstrip("/").removesuffix("/v1") if url else find_target(cfg)
        err.print(f"[dim]load test {scenario!r} against {base}[/]")
        with Live(Text("starting Locust"), console=err, transient=True, refresh_per_second=4) as live:
            def tick(elapsed: float, done: int, errors: int) -> None:
                live.update(Text.assemble(("locust ", "bold"), (f"{elapsed:5.0f} s  ", "cyan"),
                                          f"{done} requests done", (f", {errors} failed" if errors else "", "red")))

            result = run_load(scenario, base, out_dir, duration, slo, cfg, profile or cfg.serve, tick)
        print_summary(result.report, result.out_dir)
        return ExitCode.OK if result.passed is not False else ExitCode.SLO_NOT_MET

    run(body)


def print_summary(report: dict, out_dir: Path) -> None:
    m = report["metrics"]
    table = Table(title=f"{report['scenario']}: {m['requests']} requests in {m['duration_s']} s")
    for col in ("metric", "p50", "p95", "p99"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    for name, label in (("ttft", "TTFT ms"), ("itl", "ITL ms"), ("tpot", "TPOT ms"), ("e2e", "E2E ms")):
        table.add_row(label, *[_fmt(m.get(f"p{p}_{name}_ms")) for p in (50, 95, 99)])
    out.print(table)
    out.print(f"throughput {_fmt(m['output_tokens_per_s'])} output tokens/s, {_fmt(m['requests_per_s'], 2)} req/s, "
              f"error rate {(m['error_rate'] or 0):.2%}")
    slo = report["slo"]
    for c in slo["clauses"]:
        mark = "[green]✓[/]" if c["met"] else "[red]✗[/]"
        out.print(f"  {mark} {c['clause']}: {_fmt(c['value'], 4)}", highlight=False)
    if slo["passed"] is not None:
        out.print(f"SLO ({slo['source']}): " + ("[bold green]PASS[/]" if slo["passed"] else "[bold red]FAIL[/]"))
    out.print(f"report: {out_dir / 'report.md'} (JSON, PNG plots, Locust CSV/HTML beside it)")


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


@app.command("scenarios")
def scenarios() -> None:
    """The scenarios in stack/load/scenarios, checked."""
    from stack.load.scenario import load_scenario_file, scenarios_dir

    def body() -> int:
        table = Table(title=f"Scenarios ({scenarios_dir()})")
        for col in ("name", "load", "prompt / output tokens", "SLO"):
            table.add_column(col)
        bad = 0
        for path in sorted(scenarios_dir().glob("*.y*ml")):
            try:
                s = load_scenario_file(path)
            except StackError as exc:
                bad += 1
                err.print(f"[red]✗[/] {exc}", highlight=False)
                continue
            load_text = (f"{s.load.rate:g} req/s, " if s.load.rate else "") + f"{s.load.peak_users} users, " \
                f"{s.load.total_s:g} s"
            req = s.requests
            table.add_row(s.name, load_text, f"{req.prompt_tokens.center} / {req.output_tokens.center}",
                          ", ".join(s.slo) or "-")
        out.print(table)
        return ExitCode.CONFIG if bad else ExitCode.OK

    run(body)
