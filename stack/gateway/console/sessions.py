"""Console sessions: a login turns a key into an HttpOnly cookie; every state-changing call carries a CSRF token.

The key itself is checked once (stack.gateway.http.auth's key rings) and never stored: the session keeps a role
(`admin` may press the model buttons; `viewer` reads and uses the playground) and the key's *name*.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

COOKIE = "vstack_console"
Role = Literal["admin", "viewer"]


@dataclass
class Session:
    role: Role
    key_name: str
    csrf: str
    expires: float

    def csrf_ok(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.csrf.encode())


class Sessions:
    """In memory (a gateway restart logs everyone out), bounded per role: when a role's sessions are full its
    oldest session goes, so logins with a client key never log an admin out (adr/0039)."""

    def __init__(self, ttl_s: float = 12 * 3600, limits: dict[str, int] | None = None) -> None:
        self.ttl_s = ttl_s
        self.limits = limits or {"admin": 64, "viewer": 256}
        self._by_token: dict[str, Session] = {}
        self._order: dict[str, OrderedDict[str, None]] = {role: OrderedDict() for role in self.limits}

    def create(self, role: Role, key_name: str) -> tuple[str, Session]:
        token = secrets.token_urlsafe(32)
        session = Session(role, key_name, secrets.token_urlsafe(24), time.time() + self.ttl_s)
        self._by_token[token] = session
        order = self._order[role]
        order[token] = None
        while len(order) > self.limits[role]:
            oldest, _ = order.popitem(last=False)
            self._by_token.pop(oldest, None)
        return token, session

    def get(self, token: str | None) -> Session | None:
        session = self._by_token.get(token or "")
        if session is None:
            return None
        if session.expires < time.time():
            self.drop(token)
            return None
        return session

    def drop(self, token: str | None) -> None:
        session = self._by_token.pop(token or "", None)
        if session is not None:
            self._order[session.role].pop(token or "", None)

    def drop_key(self, key_name: str) -> int:
        """End every session a key opened (the key was revoked); how many."""
        tokens = [t for t, s in self._by_token.items() if s.key_name == key_name]
        for token in tokens:
            self.drop(token)
        return len(tokens)

    def count(self, role: Role) -> int:
        return len(self._order[role])
