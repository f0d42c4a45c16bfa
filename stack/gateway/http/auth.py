"""API keys: compared as SHA-256 digests in constant time; only the key's *name* is ever logged.

Keys come from the config as hashes or from environment variables (hashed on load, the clear value is
dropped). With no client key configured /v1/* is open. Without an admin key /admin/* answers local clients
only, with the admin token where the gateway drew one (stack.manager.admin_token).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from collections.abc import Mapping

from stack.config.sections.gateway import KeyRef
from stack.errors import ConfigError
from stack.gateway.openai_errors import Forbidden, Unauthorized
from stack.gateway.tenants.book import TenantBook
from stack.gateway.tenants.gate import Caller


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyRing:
    """Named key digests. `check` compares against every entry so timing does not say which one matched."""

    def __init__(self, digests: Mapping[str, bytes]) -> None:
        self._digests = list(digests.items())

    @classmethod
    def from_refs(cls, refs: list[KeyRef], environ: Mapping[str, str] | None = None) -> KeyRing:
        env = os.environ if environ is None else environ
        digests: dict[str, bytes] = {}
        for i, ref in enumerate(refs):
            if ref.sha256:
                digests[ref.name if ref.name not in digests else f"{ref.name}#{i}"] = bytes.fromhex(ref.sha256)
                continue
            value = env.get(ref.env or "", "")
            if not value:
                if ref.optional:
                    continue
                raise ConfigError(
                    f"gateway key {ref.name!r}: environment variable {ref.env} is not set",
                    hint=f"export {ref.env}=... or mark the entry `optional: true`",
                )
            digests[ref.name if ref.name not in digests else f"{ref.name}#{i}"] = hashlib.sha256(
                value.encode()
            ).digest()
        return cls(digests)

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    @classmethod
    def union(cls, *rings: KeyRing) -> KeyRing:
        """Every key of these rings (names kept): /metrics answers the metrics, client and admin keys."""
        merged = KeyRing({})
        merged._digests = [item for ring in rings for item in ring._digests]
        return merged

    def shared_with(self, other: KeyRing) -> list[tuple[str, str]]:
        """(our name, their name) of each key both rings accept."""
        return [(mine, theirs) for mine, a in self._digests for theirs, b in other._digests
                if hmac.compare_digest(a, b)]  # fmt: skip

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self._digests]

    def check(self, presented: str | None) -> str | None:
        """The matching key's name, or None."""
        if presented is None:
            return None
        digest = hashlib.sha256(presented.encode()).digest()
        found = None
        for name, stored in self._digests:
            if hmac.compare_digest(digest, stored) and found is None:
                found = name
        return found


def bearer(authorization: str | None, api_key_header: str | None = None) -> str | None:
    """The key from `Authorization: Bearer ...` (OpenAI clients) or `x-api-key` (Anthropic-style clients)."""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return api_key_header or None


def require_client_key(ring: KeyRing, authorization: str | None, api_key_header: str | None) -> str | None:
    if not ring.enabled:
        return None
    presented = bearer(authorization, api_key_header)
    if presented is None:
        raise Unauthorized(
            "You didn't provide an API key. Send it as `Authorization: Bearer YOUR_KEY`.",
            code="missing_api_key",
        )
    name = ring.check(presented)
    if name is None:
        # Never echo the presented key (OpenAI echoes a masked one; we do not even do that).
        raise Unauthorized("Incorrect API key provided.")
    return name


def require_caller(ring: KeyRing, book: TenantBook, authorization: str | None,
                   api_key_header: str | None) -> Caller:  # fmt: skip
    """Who may call /v1: a named key (client or admin role; a viewer key is refused), or a gateway.api_keys key.
    With named keys configured /v1 needs a key, as with api_keys: a quota that a missing key escapes is none."""
    if not book.enabled:
        return Caller(require_client_key(ring, authorization, api_key_header))
    presented = bearer(authorization, api_key_header)
    tenant = book.identify(presented)
    if tenant is None:
        if ring.enabled:
            return Caller(require_client_key(ring, authorization, api_key_header))
        if presented is None:
            raise Unauthorized("You didn't provide an API key. Send it as `Authorization: Bearer YOUR_KEY` (this "
                               "gateway uses named keys: an admin gives one with `vstack keys add NAME`).",
                               code="missing_api_key")  # fmt: skip
        raise Unauthorized("Incorrect API key provided.")
    if tenant.role == "viewer":
        raise Forbidden(f"key {tenant.name!r} is a viewer key: it opens the console and /metrics, not /v1; ask an "
                        "admin for a client key (vstack keys add NAME --role client)", code="viewer_key")
    return Caller(tenant.name, tenant)


FORWARDED = ("x-forwarded-for", "forwarded", "x-real-ip")


def local_client(client_host: str | None, headers: Mapping[str, str] | None = None) -> bool:
    """A loopback peer that does not forward for someone else: a reverse proxy on this machine (not listed in
    gateway.trusted_proxies) relays remote clients from 127.0.0.1, and they are not local."""
    return is_loopback(client_host) and not any(h in (headers or {}) for h in FORWARDED)


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def require_admin(
    ring: KeyRing, authorization: str | None, api_key_header: str | None, local: bool, token: str | None = None
) -> str:
    """The admin key's name; without an admin key, a local client (`local_client`) that sends the admin token
    (stack.manager.admin_token) when this gateway drew one, else any local client (a gateway built in-process)."""
    if not ring.enabled:
        if not local:
            raise Forbidden(
                "the admin API answers clients on this machine only unless gateway.admin_key is "
                "configured (VSTACK_ADMIN_KEY)"
            )
        if token is None:
            return "loopback"
        presented = bearer(authorization, api_key_header)
        if presented is not None and hmac.compare_digest(presented.encode(), token.encode()):
            return "admin-token"
        raise Unauthorized(
            "admin token required: `vstack` sends it from STATE_DIR/admin-token (this user's "
            'state_dir); with curl: -H "Authorization: Bearer $(cat STATE_DIR/admin-token)", or '
            "set VSTACK_ADMIN_KEY",
            code="admin_token_required",
        )
    presented = bearer(authorization, api_key_header)
    name = ring.check(presented)
    if name is None:
        raise Unauthorized("admin key required" if presented is None else "Incorrect admin key provided.")
    return name
