"""A client that goes away aborts its request upstream, on every route, streamed or not.

Starlette cancels a *streamed* answer when the client disconnects, but a plain (non-streamed) handler runs
on: the engine would go on generating an answer nobody reads, for as long as max_tokens lets it. This ASGI
middleware listens for the disconnect once the request body is read and cancels the handler's task; the
cancellation closes the upstream connection (aiohttp on the local fast path, httpx inside LiteLLM on the
cloud path), and vLLM aborts a request whose connection closed. The request is marked `client_gone` in
the scope's state, so the request log records 499 (the client's abort), not the 200 we never sent.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DISCONNECT: Message = {"type": "http.disconnect"}


class AbortOnDisconnect:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        gone = asyncio.Event()
        answered = False  # the whole answer went out: a disconnect now is no abort
        listener: asyncio.Task | None = None
        handler: asyncio.Task | None = None

        async def listen() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not answered:
                scope.setdefault("state", {})["client_gone"] = True
                if handler is not None:
                    handler.cancel()
            gone.set()

        async def guarded_receive() -> Message:
            nonlocal listener
            if listener is not None:  # the body is read: only the disconnect is left to hear
                await gone.wait()
                return DISCONNECT
            message = await receive()
            if message["type"] == "http.disconnect":
                scope.setdefault("state", {})["client_gone"] = True
                gone.set()
            elif not message.get("more_body"):
                listener = asyncio.get_running_loop().create_task(listen(), name="client disconnect")
            return message

        async def watched_send(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.body" and not message.get("more_body"):
                answered = True
            await send(message)

        handler = asyncio.get_running_loop().create_task(self.app(scope, guarded_receive, watched_send))
        try:
            await handler
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the server itself cancels us (shutdown): not the client's abort
            if not scope.get("state", {}).get("client_gone"):
                raise
        finally:
            if listener is not None:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listener
