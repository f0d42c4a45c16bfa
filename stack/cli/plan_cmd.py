"""`vstack plan MODEL`: will it fit, with which settings, and why; `vstack plan` (or `--up`): the whole plan
`vstack up` would run (stack.planner.plans), the object it hands its processes. Thin: parse, call the
library, print.

Mounted by stack/cli/root.py as `app.command("plan")(plan_command)`; also runs alone:
`python -m stack.entrypoints.run stack.cli.plan_cmd`.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import typer
import yaml
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stack.cli import complete
from stack.cli.every_command import ConfigOpt, cli_config, report, run
from stack.errors import ExitCode, StackError
from stack.planner.decisions import Fit, Request
from stack.planner.memory import GIB

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
    model: Annotated[str | None, typer.Argument(help="a configured model or profile, a Hub repository id, or a "
                                                     "local folder", autocompletion=complete.profiles_and_models)
                                 ] = None,
    models: Annotated[str | None, typer.Option("--models", help="A,B,C: several models switched on one GPU: the "
                                               "tier each sleeps in and its expected switch time")] = None,
    host_ram_gib: Annotated[float | None, typer.Option("--host-ram-gib", min=1, help="with --models: the host's "
                                                       "RAM (default: this machine's available RAM)")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help=GPU_HELP, autocompletion=complete.hardware)] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", min=1, help="how many GPUs (default: the profile's)")] = None,
    context: Annotated[int | None, typer.Option("--context", min=1, help="max_model_len wanted")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1,
                                             help="requests of that length that must fit at once")] = 1,
    set_: Annotated[list[str] | None, typer.Option("--set", help="engine option KEY=VALUE (repeatable)")] = None,
    up: Annotated[bool, typer.Option("--up", help="the whole plan `vstack up [MODEL]` would run on this machine "
                                     "(the default without MODEL): every model's fit, `vllm serve` line and "
                                     "placement; models not here yet are planned from the Hub's metadata")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
    config: ConfigOpt = None,
) -> None:
    """Plan how MODEL fits: the memory budget, and each engine setting decided with its reason. Without MODEL
    (or with --up): what `vstack up` would run, as the plan it hands the gateway."""
    from stack.planner.fit_planner import fit_model

    console = Console()
    if model is None and models is None:
        up = True
    if up and (models or gpu or gpus or context or concurrency != 1 or set_ or host_ram_gib):
        raise typer.BadParameter("--up plans what `vstack up` runs on this machine, as configured: drop --models, "
                                 "--gpu, --gpus, --context, --concurrency, --set, --host-ram-gib",
                                 param_hint="--up")  # fmt: skip
    if not up and (model is None) == (models is None):
        raise typer.BadParameter("give one MODEL, or several with --models A,B,C", param_hint="MODEL / --models")
    names = [m.strip() for m in (models or "").split(",") if m.strip()]
    if models is not None and len(names) < 2:
        raise typer.BadParameter(f"{models!r}: name two models or more, e.g. --models llama-3.1-8b-instruct,"
                                 "qwen2.5-7b-instruct", param_hint="--models")  # fmt: skip

    def body() -> None:
        nonlocal gpu
        cfg = cli_config()
        if up:
            return plan_up_command(cfg, model, as_json, console)
        if names:
            return plan_several(cfg, names, gpu, host_ram_gib, _parse_sets(set_ or []), as_json, console)
        info = None
        if gpu is None and model in cfg.profiles:
            gpu = cfg.profiles[model].hardware  # a profile is planned on the hardware it was written for
        if gpu is None:
            from stack.hardware import detect, match_profile

            info = detect()
            profile, _why = match_profile(info, cfg)
            gpu = profile.name
        request = Request(context=context, concurrency=concurrency, gpus=gpus)
        plan = fit_model(cfg, model, gpu, request, engine=_parse_sets(set_ or []),
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


def plan_up_command(cfg: Any, target: str | None, as_json: bool, console: Console) -> None:
    """The StackPlan `vstack up [target]` would run here, nothing fetched: its JSON (secrets masked) is what the
    gateway process receives."""
    from stack.assemble.planning import plan_up

    plan = plan_up(cfg, target, on_status=lambda s: None if as_json else console.print(f"[dim]{s}[/]"),
                   fetch=False)
    if as_json:
        print(json.dumps(plan.public(), indent=2, sort_keys=True))
        return
    for note in plan.notes:
        console.print(f"note: {note}", highlight=False)
    for m in plan.models:
        role = "default" if m is plan.default else "switchable"
        console.print(f"[bold]{m.served_name}[/] ({role}; profile {m.profile}; {m.runs_on.kind}: {m.runs_on.detail})",
                      highlight=False)  # fmt: skip
        if m.fit is not None:
            fit = m.fit
            console.print(f"  fit: {fit.summary()}; {fit.budget.device} {fit.budget.requested / GIB:.2f} GiB",
                          highlight=False)  # fmt: skip
        console.print(Text("  " + m.display()), soft_wrap=True)
        for note in m.notes:
            console.print(Text(f"  note: {note}"), soft_wrap=True)


def plan_several(cfg: Any, names: list[str], gpu: str | None, host_ram_gib: float | None, engine: dict[str, Any],
                 as_json: bool, console: Console) -> None:  # fmt: skip
    """`--models`: each planned on the GPU, then the tiers and switch times (stack.manager.switch_plan)."""
    import psutil

    from stack.manager.switch_plan import HostRam, switch_plan
    from stack.planner.fit_planner import fit_model

    if gpu is None or cfg.hardware.get(gpu) is None or cfg.hardware[gpu].accelerator != "gpu":
        gpus = ", ".join(sorted(n for n, h in cfg.hardware.items() if h.accelerator == "gpu"))
        raise typer.BadParameter(f"{gpu!r}: --models needs a GPU profile (sleep mode is GPU only): one of {gpus}",
                                 param_hint="--gpu")  # fmt: skip
    plans = [fit_model(cfg, name, gpu, Request(), engine=engine) for name in names]
    if host_ram_gib:
        host = HostRam(int(host_ram_gib * GIB), int(host_ram_gib * GIB), "--host-ram-gib")
    else:
        vm = psutil.virtual_memory()
        host = HostRam(vm.total, vm.available, "this machine (--host-ram-gib for another)")
    m = cfg.manager
    out = switch_plan(plans, gpu, host, fraction=m.host_memory_fraction, per_engine_gib=m.host_per_engine_gib,
                      budget_gib=m.host_memory_budget_gib, sleep_level=str(m.sleep_level), overlap=m.overlap_wake,
                      keep_prefix=m.keep_prefix_cache, prefix_gib=m.prefix_cache_gib)
    if as_json:
        print(json.dumps(out, indent=2))
        return
    bus = out["bus"]
    console.print(f"[bold]{len(names)} models on {gpu}[/]: host RAM {out['host_ram_gib']} GiB "
                  f"({out['host_ram_source']}), level-1 budget {out['level1_budget_gib']} GiB; bus "
                  f"{bus['h2d_gbps']} / {bus['d2h_gbps']} GB/s in/out ({bus['source']})", highlight=False)  # fmt: skip
    # Numbers in a narrow table (no column wraps at 80), each model's reasons below it as wrapped text.
    table = Table(show_edge=False, box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("model", no_wrap=True)
    for col in ("weights", "need", "tier", "wake", "switch", "overlap"):
        table.add_column(col, no_wrap=True, justify="right" if col != "tier" else "left")
    secs = lambda v: "-" if v is None else f"{v:.2f}s"  # noqa: E731
    for r in out["models"]:
        # The prefix cache kept across sleep (host RAM) shows with the tier, as in `vstack models`: level1+4G.
        tier = r["tier"] + (f"+{r['prefix_cache_gib']:g}G" if r["prefix_cache_gib"] else "")
        table.add_row(r["model"], f"{r['weights_gib']:.1f}G", f"{r['need_gib']:.1f}G", tier, secs(r["wake_s"]),
                      secs(r["switch_sequential_s"]), secs(r["switch_overlapped_s"]))  # fmt: skip
    console.print(table)
    for r in out["models"]:
        came = f" (switch from {r['from']})" if r["from"] else ""
        console.print(f"[bold]{r['model']}[/]{came}: {r['why']}" + (f"; {r['order']}" if r["order"] else "")
                      + f"; prefix cache: {r['prefix_cache']}", highlight=False)


def print_plan(plan: Fit, console: Console) -> None:
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
                  f"({plan.budget.kv / GIB:.2f} GiB){' per rank' if plan.data_parallel > 1 else ''}", highlight=False)
    if plan.data_parallel > 1:  # the budget and KV line above are one rank's
        console.print(f"{plan.summary()} in all", highlight=False)
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

