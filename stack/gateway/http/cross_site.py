"""What a web page could make the operator's browser send to the gateway, refused (adr/0039).

A page on any origin can make a browser send a form or a "simple" fetch to http://127.0.0.1:PORT, and a DNS
name the attacker controls can be re-pointed at 127.0.0.1 (DNS rebinding) so the page's own origin reaches the
gateway with `Host: attacker.example`. So, before any route runs:

- `/admin/*` and `/ui/*` answer only a `Host` the gateway serves: a loopback name (localhost, 127.0.0.1,
  [::1], *.localhost), any IP address written as such (a rebinding needs a *name*), this machine's host name,
  `gateway.host` and `gateway.allowed_hosts`; else 421. Without a client key, every other route except /health
  and /ready does the same for a request that arrived on a loopback address (the gateway on 127.0.0.1 with
  /v1 open is the rebinding target; with a key, a page cannot use /v1 anyway, and a published gateway is
  reached by whatever name its clients use).
- a POST/PUT/PATCH/DELETE to `/admin/*` or `/ui/*` is refused (403) when the browser says it comes from
  another origin (`Origin`, `Sec-Fetch-Site`), and (415) unless its body is JSON or empty without a type: a
  form or text/plain post is what a page can send without asking CORS first.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]
GUARDED = ("/admin", "/ui")
UNGUARDED = ("/health", "/ready")  # probes (Docker, Kubernetes) send whatever Host their runner uses
UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
SAME_SITE = ("", "same-origin", "none")  # Sec-Fetch-Site of this gateway's own pages, typed URLs, non-browsers
DEFAULT_PORTS = {"http": "80", "https": "443"}
SETTING_HINT = "gateway.allowed_hosts (VSTACK_GATEWAY__ALLOWED_HOSTS='[\"NAME\"]')"


def guarded(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in GUARDED)


def split_host(value: str) -> tuple[str, str]:
    """`Host` (or an origin's netloc) -> (lower-case name without brackets, port or "")."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        return name, rest.removeprefix(":")
    name, _, port = value.partition(":") if value.count(":") == 1 else (value, "", "")
    return name, port


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostNames:
    """The names this gateway answers to on /admin and /ui."""

    def __init__(self, configured: str, allowed: list[str]) -> None:
        names = {"localhost"}
        if configured and configured not in ("0.0.0.0", "::", ""):
            names.add(configured.lower().strip("[]"))
        with contextlib.suppress(OSError):
            names.add(socket.gethostname().lower())  # never getfqdn(): it asks DNS
        entries = [a.strip().lower() for a in allowed if a.strip()]
        self.any = "*" in entries
        self.suffixes = tuple(a for a in entries if a.startswith("."))
        self.names = frozenset(names | {a for a in entries if not a.startswith(".")})

    def serves(self, host: str) -> bool:
        name, _ = split_host(host)
        if self.any or name in self.names or name.endswith(".localhost") or is_ip(name):
            return True
        return any(name.endswith(s) or name == s[1:] for s in self.suffixes)


def same_origin(origin: str, host: str) -> bool:
    parts = urlsplit(origin)
    if parts.scheme not in DEFAULT_PORTS or not parts.netloc:
        return False  # "null" (a sandboxed frame, a file: page, a redirect across origins) included
    o_name, o_port = split_host(parts.netloc)
    h_name, h_port = split_host(host)
    default = DEFAULT_PORTS[parts.scheme]
    return o_name == h_name and (o_port or default) == (h_port or default)


def json_or_empty(headers: dict[bytes, bytes]) -> bool:
    kind = headers.get(b"content-type")
    if kind is not None:
        media = kind.split(b";", 1)[0].strip().lower()
        return media == b"application/json" or media.endswith(b"+json")
    return headers.get(b"content-length", b"0").strip() == b"0" and b"transfer-encoding" not in headers


def checked(scope: Scope, open_api: bool) -> bool:
    """Whether this request is looked at at all: /admin and /ui always; the rest only with /v1 open and on a
    loopback address (what a keyed or published gateway's /v1 pays is this test, no header parsing)."""
    path = scope.get("path", "")
    if guarded(path):
        return True
    return open_api and path not in UNGUARDED and _loopback((scope.get("server") or ("", 0))[0])


def problem(scope: Scope, headers: dict[bytes, bytes], names: HostNames) -> tuple[int, str, str] | None:
    """(status, code, message) of a request `checked` looks at and refuses, else None."""
    path = scope.get("path", "")
    on_admin = guarded(path)
    host = headers.get(b"host", b"").decode("latin-1")
    if host and not names.serves(host):
        return (421, "misdirected_host",
                f"this gateway does not serve the host name {split_host(host)[0]!r} (Host header): a page whose "
                "DNS name points at this machine may not drive it. If you reach the gateway by this name, add it "
                f"to {SETTING_HINT}")  # fmt: skip
    if not on_admin or scope.get("method") not in UNSAFE:
        return None
    origin = headers.get(b"origin")
    site = headers.get(b"sec-fetch-site", b"").decode("latin-1").lower()
    if (origin is not None and not same_origin(origin.decode("latin-1"), host)) or site not in SAME_SITE:
        return (403, "cross_site",
                f"cross-site request refused: {path} takes changes only from this gateway's own pages and from "
                "programs (vstack, curl), never from another site's page")  # fmt: skip
    if not json_or_empty(headers):
        return (415, "json_required",
                f"{path} takes a JSON body (Content-Type: application/json) or none: a form or text/plain "
                "post is what another site's page could send")  # fmt: skip
    return None


@functools.lru_cache(maxsize=64)  # the addresses a gateway listens on: a handful, looked up per request
def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class CrossSiteGuard:
    """ASGI middleware: `problem` answered in OpenAI's error shape before any route (or the fast path) runs."""

    def __init__(self, app: ASGIApp, names: HostNames, open_api: bool = True) -> None:
        self.app, self.names, self.open_api = app, names, open_api

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and checked(scope, self.open_api):
            refused = problem(scope, dict(scope.get("headers") or ()), self.names)
            if refused is not None:
                status, code, message = refused
                body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                             "code": code}}).encode()  # fmt: skip
                await send({"type": "http.response.start", "status": status,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})  # fmt: skip
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
