"""The manager's one error for a request: its model cannot be served now (the gateway answers 503)."""

from __future__ import annotations

from stack.errors import StackError


class ModelUnavailable(StackError):
    """A model is switching with a full queue, did not get ready in time, failed, or the gateway is
    shutting down. `retry_after`: seconds a client should wait (the gateway's Retry-After header)."""

    def __init__(self, message: str, retry_after: int = 5) -> None:
        super().__init__(message)
        self.retry_after = retry_after
