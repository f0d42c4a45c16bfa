"""`vstack config validate|render`: is the configuration valid, and what `vllm serve` does a profile become."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from stack.cli.every_command import ConfigOpt, cli_config, config_path, err, out, run
from stack.config import load_config
from stack.config.loader import display_path, read_yaml
from stack.config.state_dir import check_state_dir
from stack.engine.ports import free_port
from stack.errors import ConfigError, StackError
from stack.hardware import detect
from stack.planner.model_planner import plan_model
from stack.planner.plans import ModelPlan
from stack.vllm.options import VllmCatalog, check_with_vllm, engine_python, installed_catalog, one_child

config_app = typer.Typer(help="Check and show configuration.", no_args_is_help=True)


def _is_file(value: str) -> bool:
    """A profile given as a file (`configs/profiles/x.yaml`) rather than a name."""
    return value.endswith((".yaml", ".yml")) and Path(value).is_file()


@contextlib.contextmanager
def waited(what: str) -> Iterator[None]:
    """A wait on a child that imports vLLM (once per vLLM version or command; 10-20 s idle, minutes on a busy
    machine: issue 50 saw 153 s): said on stderr before it starts, and its seconds after."""
    started = time.monotonic()
    err.print(f"[dim]{what}...[/]", highlight=False)
    yield
    err.print(f"[dim]  done in {time.monotonic() - started:.0f} s[/]", highlight=False)


def _catalog(path: Path | None, cfg) -> VllmCatalog:
    """The options of the vLLM dump given, else of the vLLM installed in the engine's Python."""
    if path:
        return VllmCatalog.load(path)
    return installed_catalog(engine_python(cfg.engine_python), cfg.cache_dir, waiting=waited)


def check_rendered(cfg, plan: ModelPlan, catalog: VllmCatalog) -> None:
    """The rendered command parsed by the installed vLLM's own parser (a child process; accepted commands are
    remembered per vLLM version): ConfigError with vLLM's own words when it refuses."""
    error = check_with_vllm(plan.python, plan.vllm_args(), catalog, cfg.cache_dir, waiting=waited)
    if error:
        raise ConfigError(f"vLLM {catalog.version} rejects the rendered command: {error}",
                          hint="`vstack config render` shows the command; fix the option it names")


@config_app.command("validate")
def config_validate(
    profile: Annotated[str | None, typer.Argument(help="profile or model name, or a profile file; default: every "
                                                  "profile")] = None,
    options_dump: Annotated[Path | None, typer.Option(
        help="check against this vLLM options dump (../shared/vllm-args format) instead of the installed vLLM")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="each profile's result as JSON")] = False,
    config: ConfigOpt = None,
) -> None:
    """Validate the configuration and each profile's engine options against the installed vLLM."""
    results: list[dict] = []

    def body() -> int:
        name_or_file = profile
        files = [Path(profile)] if profile and _is_file(profile) else []
        cfg = load_config(config_path(), profile_files=files)
        check_state_dir(cfg)
        # One child imports vLLM's CLI once for every question of this command (its version, options, parser).
        with one_child(engine_python(cfg.engine_python)):
            if files:  # the file's profile, by the name it gives itself (else the file's name)
                entry = read_yaml(files[0], label=display_path(files[0]))
                name_or_file = str(entry.get("name") or files[0].stem) if isinstance(entry, dict) else files[0].stem
            info = detect()
            catalog = _catalog(options_dump, cfg)
            names = [name_or_file] if name_or_file else [*sorted(cfg.profiles), "auto"]
            failed = 0
            for name in names:
                # The installed vLLM's own parser checks the one named profile; all profiles get the catalog check.
                check = profile is not None and options_dump is None
                try:
                    plan = plan_model(cfg, name, info, catalog, port=cfg.port or 8000, for_launch=False)
                    if check and not any(n.startswith("not servable here") for n in plan.notes):
                        check_rendered(cfg, plan, catalog)
                except StackError as exc:
                    failed += 1
                    results.append({"name": name, "valid": False, "error": exc.message, "fix": exc.hint})
                    if not as_json:
                        out.print(f"[red]✗[/] {name}")
                        out.print(Text("    " + str(exc).replace("\n", "\n    ")))
                    continue
                warnings = [n for n in plan.notes if n.startswith("fit: ") and "not planned" not in n]
                results.append({"name": name, "valid": True, "hardware": plan.hardware.name,
                                "model": plan.model.name, "vllm": f"{plan.vllm.distribution} "
                                f"{plan.vllm.version}", "warnings": warnings + list(plan.warnings)})
                if as_json:
                    continue
                out.print(f"[green]✓[/] {name} [dim]({plan.hardware.name} + {plan.model.name}, "
                          f"{plan.vllm.distribution} {plan.vllm.version})[/]")
                for note in plan.notes:
                    if note.startswith("not servable here"):
                        out.print(f"    [dim]{note}[/]", highlight=False)
                    elif note.startswith("fit: ") and "not planned" not in note:
                        out.print(f"    [yellow]warning:[/] {note}", highlight=False)
                for warning in plan.warnings:
                    out.print(f"    [yellow]warning:[/] {warning}", highlight=False)
            if as_json:
                out.print_json(data={"valid": not failed, "checked": len(names), "profiles": results})
                return 2 if failed else 0
            if failed:
                err.print(f"[red]{failed} of {len(names)} invalid[/]")
                return 2
            out.print(f"configuration valid ({len(names)} checked)")
            return 0

    run(body)


@config_app.command("render")
def config_render(
    profile: Annotated[str | None, typer.Argument(help="profile or model; default: what `serve:` names")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="argv and env as JSON")] = False,
    options_dump: Annotated[Path | None, typer.Option(help="render for this vLLM options dump")] = None,
    config: ConfigOpt = None,
) -> None:
    """Show the exact `vllm serve` command a profile becomes (secrets redacted): the argv of its ModelPlan, the
    object `vstack up` hands its processes (`vstack plan --json` prints all of it)."""

    def body() -> None:
        cfg = cli_config()
        plan = plan_model(cfg, profile, detect(), _catalog(options_dump, cfg), port=cfg.port or free_port(),
                          for_launch=False)
        if as_json:
            out.print_json(data={
                "profile": plan.profile, "vllm": f"{plan.vllm.distribution} {plan.vllm.version}",
                "argv": ["vllm", "serve", *plan.redacted_args()],
                "env": plan.redacted_env(),
                "warnings": list(plan.warnings), "notes": list(plan.notes),
            })
            return
        for warning in plan.warnings:
            err.print(f"[yellow]warning:[/] {warning}", highlight=False)
        for note in plan.notes:  # what the model's family and adapters decided (stack.planner.serving)
            if note.startswith(("family:", "tools:", "adapter:")):
                err.print(f"[dim]# {note}[/]", highlight=False)
        out.print(Text(plan.display()), soft_wrap=True)

    run(body)
