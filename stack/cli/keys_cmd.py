"""`vstack keys add/list/revoke/usage/hash`: named keys (tenants) of the running gateway (adr/0043).

`add` asks the gateway to draw a key, prints it once and nothing keeps it but the person who ran the command
(the gateway keeps its SHA-256 in state_dir/runtime.json). `hash` prints the SHA-256 of a key read from
stdin, for a key declared in the configuration (`gateway.tenants[].sha256`).
"""

from __future__ import annotations

import hashlib
import sys
from typing import Annotated

import typer
from rich.table import Table

from stack.cli.every_command import ConfigOpt, UrlOpt, cli_config, cli_url, out, run

keys_app = typer.Typer(help="Named keys (tenants): add, list, revoke, usage, hash.", no_args_is_help=True)


@keys_app.command("add")
def keys_add(
    name: Annotated[str, typer.Argument(help="the key's name (in logs, metrics, Activity and Usage)")],
    role: Annotated[str, typer.Option(help="client, viewer or admin")] = "client",
    model: Annotated[
        list[str] | None, typer.Option("--model", "-m", help="a model it may use (repeat); none: every model")
    ] = None,
    priority: Annotated[str, typer.Option(help="high, normal or low")] = "normal",
    weight: Annotated[float, typer.Option(help="its share against the others of its class")] = 1.0,
    rpm: Annotated[int | None, typer.Option(help="requests per minute")] = None,
    tpm: Annotated[int | None, typer.Option(help="tokens per minute")] = None,
    concurrent: Annotated[int | None, typer.Option(help="requests in flight at once")] = None,
    tokens_per_day: Annotated[int | None, typer.Option("--tokens-per-day", help="tokens per UTC day")] = None,
    token_budget: Annotated[int | None, typer.Option("--token-budget", help="tokens in all")] = None,
    budget_usd: Annotated[float | None, typer.Option("--budget-usd", help="money on cloud deployments")] = None,
    spill: Annotated[bool, typer.Option("--spill", help="over a limit: to the model's fallbacks (the cloud)")] = False,
    replace: Annotated[bool, typer.Option("--replace", help="change the key of this name (it keeps its key)")] = False,
    rotate: Annotated[bool, typer.Option("--rotate", help="with --replace: draw a new key (the old stops)")] = False,
    sha256: Annotated[str | None, typer.Option(help="the SHA-256 of a key you drew (`vstack keys hash`)")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    url: UrlOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Add a named key to the running gateway; the key is printed once (the gateway keeps only its hash)."""
    from stack.manager.client import admin

    limits = {
        k: v
        for k, v in {
            "rpm": rpm,
            "tpm": tpm,
            "concurrent": concurrent,
            "tokens_per_day": tokens_per_day,
            "token_budget": token_budget,
            "budget_usd": budget_usd,
        }.items()
        if v is not None
    }
    spec = {"name": name, "role": role, "models": model or [], "priority": priority, "weight": weight,
            "spill": spill, "limits": limits, "replace": replace, "rotate": rotate,
            **({"sha256": sha256} if sha256 else {})}  # fmt: skip

    def body() -> None:
        done = admin(cli_config().state_dir, "POST", "/admin/keys", url=cli_url(), body=spec)
        if as_json:
            out.print_json(data=done)
            return
        out.print(f"[green]✓[/] key {done['name']!r} ({done['role']}, {done['priority']})"
                  + (f" [yellow]{done['warning']}[/]" if done.get("warning") else ""))  # fmt: skip
        if done.get("key"):
            out.print("its key, shown this once (the gateway keeps only its SHA-256):")
            print(done["key"])

    run(body)


@keys_app.command("list")
def keys_list(
    as_json: Annotated[bool, typer.Option("--json")] = False, url: UrlOpt = None, config: ConfigOpt = None
) -> None:
    """Every named key: role, models, class, limits, and what it uses now."""
    from stack.manager.client import admin

    def body() -> None:
        answer = admin(cli_config().state_dir, "GET", "/admin/keys", url=cli_url())
        if as_json:
            out.print_json(data=answer)
            return
        table = Table(title="Named keys")
        for col in ("name", "role", "priority", "models", "limits", "last minute", "today", "in all", "source"):
            table.add_column(col, overflow="fold")
        for k in answer["keys"]:
            limits = ", ".join(f"{n} {v}" for n, v in k["limits"].items()) or "-"
            table.add_row(k["name"], k["role"], k["priority"], ", ".join(k["models"]) or "all", limits,
                          f"{k['requests_last_minute']} req, {k['tokens_last_minute']} tok", str(k["tokens_today"]),
                          f"{k['tokens_total']} tok, ${k['cost_usd']:.4f}", k["source"])  # fmt: skip
        out.print(table)
        for name in answer.get("revoked", []):
            out.print(f"[yellow]revoked:[/] {name}")

    run(body)


@keys_app.command("revoke")
def keys_revoke(
    name: Annotated[str, typer.Argument(help="the key's name (`vstack keys list`)")],
    url: UrlOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Revoke a named key at once (one the configuration declares stays revoked across restarts)."""
    from urllib.parse import quote

    from stack.manager.client import admin

    def body() -> None:
        done = admin(cli_config().state_dir, "DELETE", f"/admin/keys/{quote(name, safe='')}", url=cli_url())
        out.print(f"[green]✓[/] revoked {done['revoked']}" + (f" ({done['warning']})" if done.get("warning") else ""))

    run(body)


@keys_app.command("usage")
def keys_usage(
    tenant: Annotated[str | None, typer.Argument(help="one key's name; none: every key")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, json or csv")] = "table",
    url: UrlOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Requests, errors, refusals, spills, tokens and cost per key and model since the gateway started."""
    from stack.manager.client import admin

    def body() -> None:
        state_dir = cli_config().state_dir
        if fmt == "csv":
            import httpx

            from stack.manager.client import admin_headers, gateway_url

            base = gateway_url(state_dir, cli_url())
            resp = httpx.get(f"{base}/admin/usage", params={"format": "csv", **({"tenant": tenant} if tenant else {})},
                             headers=admin_headers(base, state_dir), timeout=10)  # fmt: skip
            resp.raise_for_status()
            sys.stdout.write(resp.text)
            return
        answer = admin(state_dir, "GET", "/admin/usage", url=cli_url(), **({"tenant": tenant} if tenant else {}))
        if fmt == "json":
            out.print_json(data=answer)
            return
        table = Table(title="Usage per key and model")
        cols = ("tenant", "model", "requests", "errors", "refused", "spilled", "tokens_in", "tokens_out", "cost_usd")
        for col in cols:
            table.add_column(col.replace("_", " "), justify="left" if col in ("tenant", "model") else "right")
        for r in answer["usage"]:
            table.add_row(*(str(r[c]) for c in cols))
        out.print(table)

    run(body)


@keys_app.command("hash")
def keys_hash(
    key: Annotated[
        str | None, typer.Argument(help="the key; none: read from stdin (keeps it out of your shell's history)")
    ] = None,
) -> None:
    """The SHA-256 of a key, for `gateway.tenants[].sha256` (the key itself never goes in a config)."""
    value = key if key is not None else sys.stdin.readline().rstrip("\n")
    if not value:
        out.print("[red]error:[/] no key given: pass it, or pipe it in (printf %s KEY | vstack keys hash)")
        raise typer.Exit(2)
    print(hashlib.sha256(value.encode()).hexdigest())
