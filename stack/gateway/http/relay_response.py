"""The streamed answer of every route: an SSE body relayed as it arrives, ended when the client leaves.

Starlette's StreamingResponse (under uvicorn's ASGI 2.3) runs the body and a disconnect listener in an anyio
task group per response: a cancel scope and a second task for every stream. Here the body runs in the
request's own task and one watcher task cancels it when the client disconnects; the body's generator sees
the cancellation as before (stack.gateway.routing.dispatcher._closing: the attempt counts the client's abort,
499), so the upstream request is closed and the engine aborts it. Same bytes, same headers, less work per
stream.
"""

from __future__ import annotations

import asyncio

from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from stack.gateway.routing.answer import Answer


class RelayResponse(StreamingResponse):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None

        async def until_disconnect() -> bool:
            while (await receive())["type"] != "http.disconnect":
                pass
            task.cancel()
            return True

        watcher = asyncio.get_running_loop().create_task(until_disconnect())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not (watcher.done() and not watcher.cancelled()):
                raise  # cancelled from elsewhere (the server shutting down): not ours to swallow
            task.uncancel()  # the client left: the stream ended as it should
        finally:
            watcher.cancel()
        if self.background is not None:
            await self.background()


def respond(answer: Answer) -> Response:
    """Routing's answer as the HTTP response: the body as the upstream gave it, or its stream relayed."""
    if answer.stream is not None:
        return RelayResponse(answer.stream, media_type=answer.media_type, headers=answer.headers)
    return Response(answer.body, answer.status, headers=answer.headers, media_type=answer.media_type)
