"""`vstack`: a thin shell. It parses, calls the library, prints with rich, and picks the exit code.

Each command group lives in its own module (config_cmd, models_cmd, lifecycle, status_cmd); this one assembles them."""

from __future__ import annotations

import inspect
from typing import Annotated

import typer
from rich.table import Table

from stack import __version__
from stack.cli.bench_cmd import app as bench_app
from stack.cli.config_cmd import config_app
from stack.cli.deployments_cmd import deployments_app
from stack.cli.every_command import ConfigOpt, UrlOpt, cli_config, out, run
from stack.cli.keys_cmd import keys_app
from stack.cli.lifecycle import down, reload, up
from stack.cli.logs_cmd import logs
from stack.cli.models_cmd import load, models_app, switch, unload
from stack.cli.patches_cmd import app as patches_app
from stack.cli.plan_cmd import plan_command
from stack.cli.status_cmd import status
from stack.cli.tune_cmd import tune_command
from stack.cli.upgrade_cmd import app as upgrade_app
from stack.hardware import GIB, detect, match_profile

app = typer.Typer(help="vllm-stack: run open models on your own GPUs.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
for command in (up, down, reload, status, logs, switch, load, unload):
    app.command()(command)
app.add_typer(config_app, name="config")
app.add_typer(models_app, name="models")
app.add_typer(deployments_app, name="deployments")
app.add_typer(keys_app, name="keys")
app.add_typer(patches_app, name="patches")
app.command("plan")(plan_command)
app.add_typer(bench_app, name="bench")
app.command("tune")(tune_command)
app.add_typer(upgrade_app, name="upgrade")


@app.callback()
def _main(config: ConfigOpt = None, url: UrlOpt = None) -> None:
    """--config and --url here apply to every command (stack.cli.every_command.config_path, cli_url)."""


@app.command()
def version(as_json: Annotated[bool, typer.Option("--json")] = False, config: ConfigOpt = None) -> None:
    """Show the versions of vllm-stack and of the installed vLLM."""
    from stack.vllm.options import engine_python, installed_version

    def body() -> None:
        cfg = cli_config()
        dist, ver = installed_version(engine_python(cfg.engine_python))
        if as_json:
            out.print_json(data={"vllm_stack": __version__, "vllm_distribution": dist, "vllm": ver})
            return
        out.print(f"vllm-stack {__version__}, {dist} {ver}")

    run(body)


# --- hardware -----------------------------------------------------------------------------------


@app.command()
def hw(as_json: Annotated[bool, typer.Option("--json")] = False, config: ConfigOpt = None) -> None:
    """Show the hardware found and the hardware profile that applies."""

    def body() -> None:
        cfg = cli_config()
        info = detect()
        profile, why = match_profile(info, cfg)
        if as_json:
            out.print_json(data={
                "accelerator": info.accelerator, "profile": profile.name, "reason": why,
                "gpus": [g.__dict__ for g in info.gpus], "cpu_count": info.cpu_count,
                "ram_total": info.ram_total, "ram_available": info.ram_available,
            })
            return
        table = Table(title="Hardware", show_header=False)
        if info.gpus:
            for g in info.gpus:
                table.add_row(f"GPU {g.index}", f"{g.name}, {g.memory_total / GIB:.1f} GiB "
                              f"({g.memory_free / GIB:.1f} free), compute {g.compute_capability}")
            table.add_row("driver", info.driver or "?")
        else:
            table.add_row("GPU", "none" + (f" ({info.nvml_error})" if info.nvml_error else ""))
        table.add_row("CPU", f"{info.cpu_count} cores")
        table.add_row("RAM", f"{info.ram_total / GIB:.1f} GiB ({info.ram_available / GIB:.1f} available)")
        table.add_row("profile", f"[bold]{profile.name}[/]: {profile.description}")
        table.add_row("why", why)
        if profile.recommended_model:
            table.add_row("suggested model", profile.recommended_model)
        out.print(table)

    run(body)



def _unwrap_help(typer_app: typer.Typer) -> None:
    """Docstrings are wrapped at 120 columns in the source; Typer's rich help keeps those breaks, which then
    cut sentences in a terminal of another width (`tune --help` at 80). One line per paragraph lets rich
    wrap them to the terminal."""
    for info in typer_app.registered_commands:
        doc = info.help or (info.callback.__doc__ if info.callback else None)
        if doc:
            info.help = unwrap(doc)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _unwrap_help(group.typer_instance)


def unwrap(doc: str) -> str:
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


_unwrap_help(app)


def main() -> None:
    app()
