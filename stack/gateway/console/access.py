"""Who may do what on the console (adr/0018): the session a page or call needs, the admin role for the
model buttons and the Keys page, the CSRF token and same origin for every POST, the session cookie."""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response

from stack.gateway.console.feeds import Console
from stack.gateway.console.sessions import COOKIE, Session
from stack.gateway.http.auth import local_client
from stack.gateway.http.route_context import GatewayState
from stack.gateway.openai_errors import Forbidden, Unauthorized


def console_of(request: Request) -> Console:
    return request.app.state.console


def login_needed(state: GatewayState) -> bool:
    return (state.keys.enabled or state.admin_keys.enabled or state.admin_token is not None
            or state.dispatcher.tenants.book.enabled)  # fmt: skip


def open_role(state: GatewayState, request: Request) -> str:
    """The role a browser gets without logging in (no key configured for what it asks): admin only where
    /admin/* would answer it without a key or a token (a gateway built in-process, a local client)."""
    local = local_client(request.client.host if request.client else None, request.headers)
    return "admin" if not state.admin_keys.enabled and state.admin_token is None and local else "viewer"


def session_of(request: Request) -> Session | None:
    return console_of(request).sessions.get(request.cookies.get(COOKIE))


def need_session(request: Request) -> Session:
    session = session_of(request)
    if session is None:
        raise Unauthorized("log in to the console first: open /ui/login", code="console_login_required")
    return session


def need_post(request: Request, admin: bool = False) -> Session:
    """A state-changing call: same origin, the session's CSRF token, and (admin) the admin role."""
    session = need_session(request)
    check_origin(request)
    if not session.csrf_ok(request.headers.get("x-csrf-token")):
        raise Forbidden("missing or wrong CSRF token: reload the page and try again", code="csrf_failed")
    if admin and session.role != "admin":
        raise Forbidden("this needs the admin role: log in with the admin key", code="admin_required")
    return session


def check_origin(request: Request) -> None:
    origin = request.headers.get("origin")
    host = request.headers.get("host", "")
    if origin is not None and origin.split("://", 1)[-1] != host:
        raise Forbidden("cross-site request refused", code="cross_site")


def set_cookie(response: Response, request: Request, token: str, ttl_s: float) -> None:
    # Secure over TLS: the request's scheme is https when uvicorn serves TLS, or when a proxy listed in
    # gateway.trusted_proxies says X-Forwarded-Proto: https (uvicorn believes no one else's header).
    response.set_cookie(
        COOKIE,
        token,
        max_age=int(ttl_s),
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
