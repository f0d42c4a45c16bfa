"""A request whose local attempts another process makes (a gateway worker, adr/0049): the dispatcher decides
as ever (admission, quotas, the manager's ticket, fallbacks, counts), and hands each local attempt's upstream
call to the delegate named here instead of opening it itself. Unset (every request of a one-process gateway):
the dispatcher opens the engine's connection itself, exactly as before."""

from __future__ import annotations

import contextvars
from typing import Any, Protocol

from stack.gateway.routing.answer import Answer


class Delegate(Protocol):
    async def attempt(self, at: Any, path: str, payload: bytes, traceparent: str | None, stream: bool,
                      strip_usage: bool) -> Answer:  # fmt: skip
        """The attempt's answer: its upstream call made elsewhere (raises UpstreamError as LocalUpstream does)."""


DELEGATE: contextvars.ContextVar[Delegate | None] = contextvars.ContextVar("vstack_delegate", default=None)
