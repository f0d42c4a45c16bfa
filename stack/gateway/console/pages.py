"""/ui/*'s pages: the HTML of each page, the login form, logging in and out.

Who may do what (adr/0018):
- a session cookie (HttpOnly, SameSite=Strict, path /ui) is needed for every page and call; with no key
  configured anywhere it is given on the first page, else by the login form;
- `admin` (the admin key; or, with no admin key, a loopback client, as /admin/* answers) may press the model
  buttons; `viewer` (an API key) reads and uses the playground;
- every POST carries the session's CSRF token in `X-CSRF-Token` and, from a browser, a same-origin `Origin`.
"""

from __future__ import annotations

import hmac
import html
import logging
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from pydantic import BaseModel, Field
from starlette.responses import Response

from stack.gateway.console.access import (
    check_origin,
    console_of,
    login_needed,
    need_post,
    open_role,
    session_of,
    set_cookie,
)
from stack.gateway.console.sessions import COOKIE, Session
from stack.gateway.http.auth import local_client
from stack.gateway.http.route_context import GatewayState, get_state
from stack.gateway.openai_errors import Unauthorized

HERE = Path(__file__).parent
log = logging.getLogger("stack.gateway.console")
PAGES = {"models": "Models", "live": "Live", "activity": "Activity", "usage": "Usage", "keys": "Keys",
         "logs": "Logs", "playground": "Playground", "plan": "Plan & config"}  # fmt: skip
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}  # fmt: skip


router = APIRouter(prefix="/ui", include_in_schema=False)


def page_html(name: str, session: Session, state: GatewayState) -> str:
    nav = "".join(f'<a href="/ui/{p}"{" aria-current=page" if p == name else ""}>{html.escape(t)}</a>'
                  for p, t in PAGES.items())  # fmt: skip
    text = (HERE / "templates" / "page.html").read_text()
    values = {"title": PAGES[name], "page": name, "nav": nav, "role": session.role, "csrf": session.csrf,
              "who": session.key_name, "login": "1" if login_needed(state) else ""}  # fmt: skip
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value if key == "nav" else html.escape(value, quote=True))
    return text


@router.get("")
async def root() -> RedirectResponse:
    return RedirectResponse("/ui/models", 307)


@router.get("/")
async def index() -> RedirectResponse:
    return RedirectResponse("/ui/models", 307)


@router.get("/login")
async def login_page(request: Request) -> HTMLResponse:
    text = (HERE / "templates" / "login.html").read_text()
    return HTMLResponse(text, headers=HEADERS)


class Login(BaseModel):
    key: str = Field(min_length=1, max_length=4096)


@router.post("/login")
async def login(body: Login, request: Request) -> JSONResponse:
    check_origin(request)
    state, console = get_state(request), console_of(request)
    client = request.client.host if request.client else None
    wait_s = console.throttle.wait_s(client)
    if wait_s:
        return JSONResponse({"error": {"message": f"too many wrong keys from {client}: try again in {wait_s} s",
                                       "type": "rate_limit_error", "param": None, "code": "login_throttled"}},
                            429, headers={"Retry-After": str(wait_s)})  # fmt: skip
    local = local_client(client, request.headers)
    tenant = state.dispatcher.tenants.book.identify(body.key)
    if tenant is not None:  # a named key: its own role (client keys get the viewer role, as API keys do)
        name, role = tenant.name, "admin" if tenant.role == "admin" else "viewer"
    elif (name := state.admin_keys.check(body.key)) is not None:
        role = "admin"
    elif state.admin_token is not None and local and hmac.compare_digest(body.key.encode(), state.admin_token.encode()):
        name, role = "admin-token", "admin"  # no admin key: the token `vstack` reads opens the console too
    elif (name := state.keys.check(body.key)) is not None:
        role = "admin" if not state.admin_keys.enabled and state.admin_token is None and local else "viewer"
    else:
        console.throttle.failed(client)
        raise Unauthorized("Incorrect key: give the admin key or an API key of this gateway", code="invalid_api_key")
    token, _ = console.sessions.create(role, name)  # type: ignore[arg-type]
    log.info("console: key %r logged in as %s from %s", name, role, client)  # the key's name, never the key
    response = JSONResponse({"role": role, "key_name": name})
    set_cookie(response, request, token, console.sessions.ttl_s)
    return response


@router.post("/logout")
async def logout(request: Request) -> JSONResponse:
    need_post(request)
    console_of(request).sessions.drop(request.cookies.get(COOKIE))
    response = JSONResponse({"logged_out": True})
    response.delete_cookie(COOKIE, path="/ui")
    return response


@router.get("/{page}")
async def page(page: str, request: Request) -> Response:
    if page not in PAGES:
        return HTMLResponse(f"<!doctype html><title>Not found</title><p>No console page {html.escape(page)!r}: "
                            '<a href="/ui/models">Models</a></p>', 404, headers=HEADERS)  # fmt: skip
    state, console = get_state(request), console_of(request)
    session, token = session_of(request), None
    if session is None:
        if login_needed(state) and (state.keys.enabled or state.dispatcher.tenants.book.enabled):
            return RedirectResponse(f"/ui/login?next=/ui/{page}", 303)
        # Nothing to log in with for reading: a session for this browser (admin only where /admin/* would be).
        token, session = console.sessions.create(open_role(state, request), "none")  # type: ignore[arg-type]
    response = HTMLResponse(page_html(page, session, state), headers=HEADERS)
    if token:
        set_cookie(response, request, token, console.sessions.ttl_s)
    return response
