"""`vstack deployments [rm ID]`: the deployments behind the running gateway, and removing one added through
/admin (also an entry runtime.json keeps that was skipped at start: its id is in `vstack status`' warning)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from stack.cli.every_command import ConfigOpt, UrlOpt, cli_config, cli_url, out, run

deployments_app = typer.Typer(
    help="Deployments behind the running gateway (no subcommand), rm ID.", invoke_without_command=True
)


@deployments_app.callback()
def deployments_list(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="the deployments and the skipped entries as JSON")] = False,
    url: UrlOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Without a subcommand: every deployment (model, kind, state, where it came from)."""
    if ctx.invoked_subcommand is not None:
        return
    from stack.manager.client import admin

    def body() -> None:
        answer = admin(cli_config().state_dir, "GET", "/admin/models", url=cli_url())
        rows = [{"model": m["model"], **d} for m in answer.get("models", []) for d in m.get("deployments", [])]
        skipped = (answer.get("gateway") or {}).get("runtime_state", {}).get("skipped") or []
        if as_json:
            out.print_json(data={"deployments": rows, "skipped": skipped})
            return
        table = Table(title="Deployments behind the gateway")
        for col in ("id", "model", "kind", "state", "added"):
            table.add_column(col, overflow="fold")
        for r in rows:
            table.add_row(
                r.get("id", "?"),
                r["model"],
                r.get("kind", "-"),
                r.get("state", "-"),
                (r.get("labels") or {}).get("added", "config") if "error" not in r else r["error"],
            )
        out.print(table)
        for s in skipped:
            out.print(f"[yellow]not restored:[/] {s['what']}: {s['why']}" +
                      (f" (remove it: {s['remove']})" if s.get("remove") else ""), soft_wrap=True)  # fmt: skip

    run(body)


@deployments_app.command("rm")
def deployments_rm(
    dep_id: Annotated[str, typer.Argument(help="the deployment's id (`vstack deployments`)")],
    url: UrlOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Remove a deployment added through /admin, or an entry of runtime.json skipped at start."""
    from urllib.parse import quote

    from stack.manager.client import admin

    def body() -> None:
        done = admin(cli_config().state_dir, "DELETE", f"/admin/deployments/{quote(dep_id, safe='')}",
                     url=cli_url())  # fmt: skip
        out.print(f"[green]✓[/] removed {done['removed']}" + (f" ({done['warning']})" if done.get("warning") else ""))

    run(body)
