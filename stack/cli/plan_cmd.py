"""`vstack plan MODEL`: will it fit, with which settings, and why. Thin: parse, call the library, print.

Mounted by stack/cli/main.py as `app.command("plan")(plan_command)`; also runs alone: `python -m stack.cli.plan_cmd`.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from stack.cli.shell import ConfigOpt, cli_config, report, run
from stack.errors import ExitCode, StackError
from stack.planner.memory import GIB
from stack.planner.plan import Plan, Request

GPU_HELP = "hardware profile: rtx4090, a100-40gb, a100-80gb, h100-80gb, h200, l4, cpu, ... (default: detected)"


def _parse_sets(values: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"{item!r}: expected KEY=VALUE, e.g. kv_cache_dtype=fp8", param_hint="--set")
        options[key.strip().replace("-", "_")] = yaml.safe_load(value)
    return options


def plan_command(
    model: Annotated[str, typer.Argument(help="a configured model name, a Hub repository id, or a local folder")],
    gpu: Annotated[str | None, typer.Option("--gpu", help=GPU_HELP)] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", min=1, help="how many GPUs (default: the profile's)")] = None,
    context: Annotated[int | None, typer.Option("--context", min=1, help="max_model_len wanted")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1,
                                             help="requests of that length that must fit at once")] = 1,
    set_: Annotated[list[str] | None, typer.Option("--set", help="engine option KEY=VALUE (repeatable)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
    config: ConfigOpt = None,
) -> None:
    """Plan how MODEL fits: the memory budget, and each engine setting decided with its reason."""
    from stack.planner.api import plan_model

    console = Console()

    def body() -> None:
        nonlocal gpu
        cfg = cli_config()
        info = None
        if gpu is None:
            from stack.hardware import detect, match_profile

            info = detect()
            profile, _why = match_profile(info, cfg)
            gpu = profile.name
        request = Request(context=context, concurrency=concurrency, gpus=gpus)
        plan = plan_model(cfg, model, gpu, request, engine=_parse_sets(set_ or []),
                          hardware_info=info if gpus is None else None)
        if as_json:
            print(json.dumps(plan.to_dict(), indent=2))
            return
        print_plan(plan, console)

    def on_error(exc: StackError) -> None:
        if as_json:
            print(json.dumps({"error": exc.message, "fix": exc.hint, "kind": type(exc).__name__}))
        else:
            report(exc, "does not fit" if exc.exit_code == ExitCode.DOES_NOT_FIT else "error")

    run(body, on_error)


def print_plan(plan: Plan, console: Console) -> None:
    s = plan.shape
    console.print(f"[bold]{plan.model}[/] on [bold]{plan.hardware}[/]: {s.architecture}, {s.num_layers} layers, "
                  f"{s.attention_kind}" + (f", {s.num_experts} experts" if s.is_moe else "")
                  + (f", {s.quantization.label}" if s.quantization.method else ""), highlight=False)
    budget = Table(title=f"memory budget ({plan.budget.device})", title_justify="left", show_edge=False)
    budget.add_column("")
    budget.add_column("GiB", justify="right")
    b = plan.budget.as_gib()
    rows = [("available to vLLM", b["requested"]), ("weights", b["weights"]), ("activation peak", b["activation"]),
            ("runtime buffers", b["runtime"]), ("CUDA graphs", b["cudagraphs"]), ("KV cache (free)", b["kv"])]
    for name, value in rows:
        budget.add_row(name, f"{value:.2f}")
    console.print(budget)
    console.print(f"KV cache: {plan.kv.bytes_per_token:,} bytes per token ({plan.kv.bytes_per_token / 1024:.0f} KiB); "
                  f"{plan.kv_tokens:,} tokens; {plan.max_concurrency:.1f} requests of {plan.max_model_len:,} at once "
                  f"({plan.budget.kv / GIB:.2f} GiB)", highlight=False)
    table = Table(title="decisions", title_justify="left", show_edge=False)
    for col in ("setting", "value", "from", "why"):
        table.add_column(col, overflow="fold")
    for d in plan.decisions:
        # "configs/models/x.yaml: models.x.engine.max_model_len" -> "models.x": the row already names the key
        where = re.sub(r"\.engine\.\w+$", "", d.origin.split(": ")[-1]) if d.origin else ""
        source = d.source + (f" ({where})" if where else "")
        table.add_row(d.key, str(d.value), source, d.reason)
    console.print(table)
    for note in plan.notes:
        console.print(f"note: {note}", highlight=False)


def main() -> None:
    typer.run(plan_command)


if __name__ == "__main__":
    main()
