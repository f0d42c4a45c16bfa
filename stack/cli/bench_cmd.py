"""`vstack bench load` and `vstack bench scenarios`: Typer commands, thin over stack.load.load_test."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from stack.cli import complete
from stack.cli.every_command import ConfigOpt, cli_config, run
from stack.errors import ExitCode, StackError

app = typer.Typer(help="Load tests with SLO reports (Locust), and the scenarios they run.", no_args_is_help=True)
out = Console()
err = Console(stderr=True)


@app.command("load")
def load(
    config: ConfigOpt = None,
    scenario: Annotated[str, typer.Option("--scenario", "-s", help="name in loadtests/scenarios, or a YAML path")
                        ] = "chat",
    duration: Annotated[float | None, typer.Option(help="seconds; default: the scenario's")] = None,
    url: Annotated[str | None, typer.Option(envvar="VSTACK_URL", help="base URL without /v1 (else $VSTACK_URL, else "
                                                 "the gateway on this host, else the engine `vstack up` started)")
                   ] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", autocompletion=complete.models,
                                              help="send every request to this model (default: the scenario's "
                                                   "mix, else the first local chat model listed; never an "
                                                   "embedding model)")] = None,
    allow_cloud: Annotated[bool, typer.Option("--allow-cloud", help="send even where a cloud provider may serve "
                                              "a request (a cloud deployment or fallback): that spends money")
                           ] = False,
    slo: Annotated[str | None, typer.Option(help="e.g. 'p95_e2e_ms<800, output_tokens_per_s>=50'; default: "
                                                 "the scenario's, else the profile's")] = None,
    profile: Annotated[str | None, typer.Option(help="whose `slo:` applies when neither --slo nor the "
                                                     "scenario sets one")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="default: results/load/NAME-TIME")] = None,
) -> None:
    """Run a scenario with Locust (headless), then write the SLO report: markdown, JSON and PNG plots.

    Needs the `loadtest` extra (./install.sh --loadtest, or --dev). The target models are shown before the
    first request; a model a cloud provider may serve (deployment or fallback) is refused without --allow-cloud.
    """
    from stack.load.load_test import check_duration, find_target, run_load
    from stack.load.scenario import find_scenario, load_scenario_file
    from stack.load.target import decide_target
    from stack.manager.client import given_url

    def body() -> int:
        check_duration(duration)
        cfg = cli_config()
        given = given_url(url)
        base = given or find_target(cfg)
        target = decide_target(base, load_scenario_file(find_scenario(scenario)), model, allow_cloud)
        err.print(f"load test {scenario!r} -> {target.describe()}", highlight=False, soft_wrap=True)
        if target.cloud:
            err.print("[yellow]--allow-cloud:[/] " + "; ".join(target.cloud), highlight=False)
        if target.unlisted:
            err.print(f"[yellow]warning:[/] the scenario names {', '.join(target.unlisted)}, which {base}/v1/models "
                      "does not list: those requests will fail", highlight=False)
        with Live(Text("starting Locust"), console=err, transient=True, refresh_per_second=4) as live:
            def tick(elapsed: float, done: int, errors: int) -> None:
                live.update(Text.assemble(("locust ", "bold"), (f"{elapsed:5.0f} s  ", "cyan"),
                                          f"{done} requests done", (f", {errors} failed" if errors else "", "red")))

            result = run_load(scenario, base, out_dir, duration, slo, cfg, profile or cfg.serve, tick,
                              target.models)
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
def scenarios(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The scenarios in loadtests/scenarios, checked."""
    from stack.load.scenario import load_scenario_file, scenarios_dir

    def body() -> int:
        rows, bad = [], []
        for path in sorted(scenarios_dir().glob("*.y*ml")):
            try:
                s = load_scenario_file(path)
            except StackError as exc:
                bad.append({"file": str(path), "error": exc.message})
                continue
            rows.append({"name": s.name, "rate": s.load.rate, "peak_users": s.load.peak_users,
                         "seconds": s.load.total_s, "prompt_tokens": s.requests.prompt_tokens.center,
                         "output_tokens": s.requests.output_tokens.center, "models": dict(s.models),
                         "slo": list(s.slo)})  # fmt: skip
        if as_json:
            out.print_json(data={"scenarios": rows, "invalid": bad})
            return ExitCode.CONFIG if bad else ExitCode.OK
        for b in bad:
            err.print(f"[red]✗[/] {b['file']}: {b['error']}", highlight=False)
        table = Table(title=f"Scenarios ({scenarios_dir()})")
        table.add_column("name", no_wrap=True)
        for col in ("load", "tokens in/out", "SLO"):
            table.add_column(col, overflow="fold")
        for r in rows:
            load_text = (f"{r['rate']:g} req/s, " if r["rate"] else "") + f"{r['peak_users']} users, {r['seconds']:g} s"
            table.add_row(r["name"], load_text, f"{r['prompt_tokens']} / {r['output_tokens']}",
                          ", ".join(r["slo"]) or "-")
        out.print(table)
        return ExitCode.CONFIG if bad else ExitCode.OK

    run(body)
