"""/admin/keys and /admin/usage: named keys (tenants) added, changed and revoked while the gateway runs, and
what each used (adr/0043).

A key added here is drawn by the gateway (`vsk-` and 256 random bits), shown once in the answer and kept only
as its SHA-256, in state_dir/runtime.json with the other runtime changes; or the caller gives the SHA-256 of
a key it drew itself. Revoking a key the configuration declares is kept there too (it stays revoked after a
restart until the configuration drops it). The same rules as the configuration: a name and a key of its own,
never an admin or client key's; the body is text (400 `invalid_text` otherwise).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from stack.config.sections.tenants import NAME, Priority, Role, TenantConfig, TenantLimits
from stack.gateway.http.admin_routes import Conflict, admin_key, require_text, unsaved
from stack.gateway.http.auth import KeyRing
from stack.gateway.http.route_context import GatewayState, get_state
from stack.gateway.openai_errors import InvalidRequest, ModelNotFound
from stack.gateway.tenants.book import Tenant, digest_of, new_key
from stack.gateway.tenants.usage import to_csv

router = APIRouter(prefix="/admin", dependencies=[Depends(admin_key)])
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class NewKey(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME)
    role: Role = "client"
    models: list[str] = Field(default_factory=list)
    priority: Priority = "normal"
    weight: float = Field(1.0, gt=0, le=1000)
    spill: bool = False
    limits: TenantLimits = Field(default_factory=TenantLimits)
    sha256: str | None = Field(None, description="the SHA-256 of a key drawn elsewhere; none: the gateway draws one")
    replace: bool = Field(False, description="change a key of this name (its key stays unless `rotate` or sha256)")
    rotate: bool = Field(False, description="with replace: draw a new key for it (the old one stops working)")


def register_key(state: GatewayState, spec: NewKey) -> tuple[Tenant, str | None]:
    """Check and add (or replace) a named key: (the tenant, the key drawn for it or None). Also the replay of
    runtime.json at start (stack.gateway.http.runtime_replay)."""
    require_text(spec.model_dump(mode="python"))
    book = state.dispatcher.tenants.book
    old = book.by_name.get(spec.name)
    if old is not None and not spec.replace:
        raise Conflict(
            f"a key named {spec.name!r} exists: give another name, or `replace: true` (vstack keys add "
            f"{spec.name} --replace) to change it",
            param="name",
            code="key_exists",
        )
    taken = set(state.keys.names) | set(state.admin_keys.names)
    if spec.name in taken:
        raise Conflict(
            f"{spec.name!r} names a gateway.api_keys or admin key entry: give the named key another name",
            param="name",
            code="key_exists",
        )
    drawn = None
    if spec.sha256 is not None:
        if not _HEX64.match(spec.sha256.lower()):
            raise InvalidRequest(
                "sha256 must be 64 hex digits (the SHA-256 of the key, not the key: vstack keys hash)", param="sha256"
            )
        digest = bytes.fromhex(spec.sha256.lower())
    elif old is not None and not spec.rotate:
        digest = old.digest
    else:
        drawn = new_key()
        digest = digest_of(drawn)
    ring = KeyRing({"new": digest})
    if ring.shared_with(state.admin_keys) or ring.shared_with(state.keys):
        raise Conflict(
            "that key is the admin key or a gateway.api_keys key: give the named key its own",
            param="sha256",
            code="key_taken",
        )
    other = next((t for t in book.by_name.values() if t.digest == digest and t.name != spec.name), None)
    if other is not None:
        raise Conflict(
            f"that key is already key {other.name!r}'s: give each named key its own", param="sha256", code="key_taken"
        )
    config = TenantConfig(
        name=spec.name,
        sha256=digest.hex(),
        role=spec.role,
        models=spec.models,
        priority=spec.priority,
        weight=spec.weight,
        spill=spec.spill,
        limits=spec.limits,
    )
    tenant = Tenant(config, digest, "runtime")
    book.add(tenant)
    return tenant, drawn


def kept(tenant: Tenant) -> dict[str, Any]:
    """A named key as runtime.json keeps it: its SHA-256, never the key."""
    return tenant.config.model_dump(mode="json", exclude_none=True)


@router.post("/keys", status_code=201)
async def add_key(spec: NewKey, request: Request) -> dict[str, Any]:
    return add_named_key(get_state(request), spec)


@router.get("/keys")
async def list_keys(request: Request) -> dict[str, Any]:
    return list_named_keys(get_state(request))


@router.delete("/keys/{name}")
async def revoke_key(name: str, request: Request) -> dict[str, Any]:
    answer = revoke_named_key(get_state(request), name)
    end_sessions_of(request, name)
    return answer


# -- shared with the console's Keys page (stack.gateway.console.api), which checks its own session first ----
def add_named_key(state: GatewayState, spec: NewKey) -> dict[str, Any]:
    """Add (or replace) a named key, kept in runtime.json; the answer has the key drawn for it, this once."""
    tenant, drawn = register_key(state, spec)
    persisted = state.runtime.set_key(tenant.name, kept(tenant))
    answer = {**tenant.public(), **unsaved(state, persisted)}
    if drawn is not None:
        answer["key"] = drawn
        answer["note"] = "the key is shown this once; the gateway keeps only its SHA-256"
    return answer


def list_named_keys(state: GatewayState) -> dict[str, Any]:
    """Every named key (never the key nor its hash) with what it used: this minute, today, in all."""
    gate = state.dispatcher.tenants
    rows = []
    for name, tenant in sorted(gate.book.by_name.items()):
        m = gate.limiter.meter(name)
        m.expire(gate.limiter.clock())
        m.roll_day(gate.limiter.clock())
        rows.append({**tenant.public(), "in_flight": m.in_flight, "tokens_last_minute": m.window_tokens,
                     "requests_last_minute": len(m.requests), "tokens_today": m.day_tokens,
                     "tokens_total": m.total_tokens, "cost_usd": round(m.cost_usd, 6)})  # fmt: skip
    revoked = sorted(n for n, spec in state.runtime.keys.items() if spec.get("revoked"))
    return {"keys": rows, "revoked": revoked}


def revoke_named_key(state: GatewayState, name: str) -> dict[str, Any]:
    gate = state.dispatcher.tenants
    tenant = gate.book.remove(name)
    if tenant is None and name in state.runtime.keys and not state.runtime.keys[name].get("revoked"):
        # kept in runtime.json but skipped at start
        return {"revoked": name, **unsaved(state, state.runtime.set_key(name, {"name": name, "revoked": True}))}
    if tenant is None:
        raise ModelNotFound(f"no named key {name!r} (vstack keys list)", param="name", code="key_not_found")
    gate.usage.forget(name)
    # Kept as revoked: a configured key stays revoked across restarts (until the configuration drops it), and
    # the gateway goes on asking for a key once the last named key is gone (stack.gateway.tenants.book).
    persisted = state.runtime.set_key(name, {"name": name, "revoked": True})
    return {"revoked": name, **unsaved(state, persisted)}


def end_sessions_of(request: Request, name: str) -> None:
    """A revoked key's console sessions end with it: its cookie must not keep the key's role for 12 hours."""
    console = getattr(request.app.state, "console", None)
    if console is not None:
        console.sessions.drop_key(name)


@router.get("/usage")
async def usage(request: Request, format: str = "json", tenant: str | None = None, minutes: int = 60) -> Any:
    return usage_answer(get_state(request), format, tenant, minutes)


def usage_answer(state: GatewayState, format: str, tenant: str | None, minutes: int) -> Any:
    """Per tenant and model since start, and tokens per minute (JSON), or the table as CSV."""
    book = state.dispatcher.tenants.usage
    rows = book.table(tenant)
    if format == "csv":
        return PlainTextResponse(to_csv(rows), media_type="text/csv",
                                 headers={"Content-Disposition": "attachment; filename=usage.csv"})  # fmt: skip
    if format != "json":
        raise InvalidRequest("format must be json or csv", param="format")
    return JSONResponse({"usage": rows, "per_minute": book.series(tenant, max(1, min(minutes, 24 * 60)))})
