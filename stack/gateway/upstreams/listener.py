"""What a relay tells about the stream it relays (stack.gateway.routing.attempt.Attempt listens): one object
with five methods instead of a dict of callbacks."""

from __future__ import annotations

from typing import Protocol


class StreamListener(Protocol):
    def first_token(self) -> None:
        """The first chunk went out (time to first token)."""

    def usage(self, usage: dict) -> None:
        """The stream's token counts (OpenAI's usage object)."""

    def failed(self, kind: str) -> None:
        """The upstream failed mid-stream; the stream ended with an error event."""

    def progress(self) -> None:
        """A chunk came (proof that the engine makes progress)."""

    def stalled(self) -> str:
        """Why the engine was found unresponsive, when that is what closed the stream; "" otherwise."""
