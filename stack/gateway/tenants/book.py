"""The named keys, found by the SHA-256 of the key a client sends.

A dict lookup by digest instead of comparing with every key in turn (as stack.gateway.http.auth.KeyRing does
for the few configured keys): with 1,000 keys that loop would cost each request ~0.1 ms. The lookup's
timing can only tell an attacker about a SHA-256 digest, which does not lead back to a key.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from stack.config.sections.tenants import PRIORITY_VALUE, TenantConfig
from stack.errors import ConfigError

CLASSES = ("high", "normal", "low")
OTHER = "other"  # the metrics' label for every request no named key made (bounded label sets)
KEY_PREFIX = "vsk-"


def new_key() -> str:
    """A fresh key: 256 random bits, URL-safe, recognisable in a leak scan by its prefix."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def digest_of(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass
class Tenant:
    config: TenantConfig
    digest: bytes = field(repr=False)
    source: Literal["config", "runtime"] = "config"

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def role(self) -> str:
        return self.config.role

    @property
    def klass(self) -> int:
        """0 high, 1 normal, 2 low: the admission queue's order."""
        return CLASSES.index(self.config.priority)

    @property
    def priority_value(self) -> int:
        return PRIORITY_VALUE[self.config.priority]

    def may_use(self, *names: str) -> bool:
        allowed = self.config.models
        return not allowed or any(n in allowed for n in names)

    def public(self) -> dict:
        """What /admin/keys and the console show: never the key, nor its hash."""
        c = self.config
        return {
            "name": c.name,
            "role": c.role,
            "models": c.models,
            "priority": c.priority,
            "weight": c.weight,
            "spill": c.spill,
            "limits": c.limits.model_dump(exclude_none=True),
            "source": self.source,
        }


class TenantBook:
    def __init__(self) -> None:
        self._by_digest: dict[bytes, Tenant] = {}
        self.by_name: dict[str, Tenant] = {}
        # Once named keys are in use, /v1 needs a key even when the last one is revoked: revoking a leaked key
        # must never open the gateway to everyone (runtime.json keeps the revoked names, so across restarts too).
        self.required = False

    @classmethod
    def from_config(cls, configs: list[TenantConfig], environ: Mapping[str, str] | None = None) -> TenantBook:
        env = os.environ if environ is None else environ
        book = cls()
        for c in configs:
            if c.sha256:
                digest = bytes.fromhex(c.sha256)
            else:
                value = env.get(c.env or "", "")
                if not value:
                    raise ConfigError(
                        f"gateway.tenants {c.name!r}: environment variable {c.env} is not set",
                        hint=f"export {c.env}=... or give the tenant `sha256:` (`vstack keys hash`)",
                    )
                digest = digest_of(value)
            book.add(Tenant(c, digest, "config"))
        return book

    @property
    def enabled(self) -> bool:
        return bool(self.by_name) or self.required

    def identify(self, presented: str | None) -> Tenant | None:
        return self._by_digest.get(digest_of(presented)) if presented else None

    def has_digest(self, digest: bytes) -> bool:
        return digest in self._by_digest

    def add(self, tenant: Tenant) -> None:
        """Add or replace (by name). A key another tenant holds is refused by the caller first (`has_digest`)."""
        self.remove(tenant.name)
        self.required = True
        self.by_name[tenant.name] = tenant
        self._by_digest[tenant.digest] = tenant

    def remove(self, name: str) -> Tenant | None:
        old = self.by_name.pop(name, None)
        if old is not None:
            self._by_digest.pop(old.digest, None)
        return old

    def digests(self) -> dict[str, bytes]:
        return {t.name: t.digest for t in self.by_name.values()}

    def label(self, tenant: Tenant | None) -> str:
        """The tenant's name as metrics carry it: only named keys, every other request is `other`."""
        return tenant.name if tenant is not None and tenant.name in self.by_name else OTHER
