"""At start: the deployments and adapters added through /admin in earlier runs, added again through the
same checks (stack.gateway.http.runtime_state keeps them). Said in the log and in /admin/models."""

from __future__ import annotations

import logging

from pydantic import ValidationError

from stack.errors import StackError
from stack.gateway.http.adapter_routes import NewAdapter, register_adapter
from stack.gateway.http.admin_routes import NewDeployment, register_deployment
from stack.gateway.http.key_routes import NewKey, register_key
from stack.gateway.http.route_context import GatewayState
from stack.gateway.http.runtime_state import shown

log = logging.getLogger("stack.gateway.runtime_state")


async def replay(state: GatewayState) -> None:
    runtime = state.runtime
    deployments, adapters = runtime.read()
    runtime.deployments, runtime.adapters = deployments, adapters  # skipped ones stay: a later start may take them
    for dep_id, body in deployments.items():
        try:
            register_deployment(state, NewDeployment.model_validate(body))
            runtime.restored.append(f"deployment {shown(dep_id)}")
        except Exception as exc:  # any entry, however broken, is skipped with its reason: the others load
            runtime.skipped.append({"what": f"deployment {shown(dep_id)}", "why": _why(exc),
                                    "remove": f"vstack deployments rm {shown(dep_id)}"})  # fmt: skip
    for name, body in adapters.items():
        try:
            await register_adapter(state, NewAdapter.model_validate(body))
            runtime.restored.append(f"adapter {shown(name)}")
        except Exception as exc:
            runtime.skipped.append({"what": f"adapter {shown(name)}", "why": _why(exc),
                                    "remove": f"DELETE /admin/adapters/{shown(name)}"})  # fmt: skip
    for name, body in dict(runtime.keys).items():  # read() filled them
        try:
            if body.get("revoked"):  # revoked through /admin: a configured key stays out, and keys stay required
                book = state.dispatcher.tenants.book
                book.required = True
                if book.remove(name) is not None:
                    runtime.restored.append(f"key {shown(name)} revoked")
                continue
            register_key(state, NewKey.model_validate({**body, "replace": True}))
            runtime.restored.append(f"key {shown(name)}")
        except Exception as exc:
            runtime.skipped.append({"what": f"key {shown(name)}", "why": _why(exc),
                                    "remove": f"vstack keys revoke {shown(name)}"})  # fmt: skip
    if runtime.restored:
        log.warning("restored %d runtime change(s) from %s: %s", len(runtime.restored), runtime.path,
                    ", ".join(runtime.restored))  # fmt: skip
    for skip in runtime.skipped:
        log.error("runtime change not restored: %s: %s", skip["what"], skip["why"])


def _why(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return shown(f"{'.'.join(str(p) for p in first.get('loc', ()))}: {first.get('msg')}")
    if isinstance(exc, StackError):
        return shown(str(getattr(exc, "message", exc)))
    return shown(f"{type(exc).__name__}: {exc}")
