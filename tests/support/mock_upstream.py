"""A fast OpenAI-compatible server: the stand-in for a cloud provider in tests, and the upstream that
isolates a proxy's own cost in bench/gateway_overhead.py.

    python tests/support/mock_upstream.py --port 9100 [--chunks 20] [--delay-ms 0] [--name mock]

Chat and text completions (streaming or not) answer `--chunks` chunks of one word each, `--delay-ms`
apart; embeddings answer a fixed vector. The requested model name steers failures (a gateway sends
each deployment's own name): `status-503` answers that status with OpenAI's error JSON, `context-2048`
answers 400 "maximum context length" like vLLM does. Built on aiohttp.web: a few thousand
requests/s on one core, far more than any proxy in front of it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from aiohttp import web

WORD = "tok "


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
    return web.json_response(body, status=status)


class Mock:
    def __init__(self, name: str, chunks: int, delay_s: float) -> None:
        self.name, self.chunks, self.delay_s = name, chunks, delay_s
        self.served = 0

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def text(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def _complete(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _error(400, "invalid JSON")
        model = str(body.get("model", ""))
        if model.startswith("status-"):
            return _error(int(model.split("-")[1]), f"mock answered {model}")
        if model.startswith("context-"):
            limit = model.split("-")[1]
            return _error(
                400, f"This model's maximum context length is {limit} tokens. Please reduce the length."
            )
        self.served += 1
        n = max(1, min(int(body.get("max_tokens") or self.chunks), self.chunks))
        rid, created = f"mock-{self.served}", int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
        headers = {"x-mock-name": self.name}
        if not body.get("stream"):
            if self.delay_s:
                await asyncio.sleep(self.delay_s * n)
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
            return web.json_response(out, headers=headers)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **headers})
        await resp.prepare(request)
        prefix = f'{{"id":"{rid}","object":"{obj}.chunk","created":{created},"model":"{model}","choices":['
        for i in range(n):
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            finish = '"length"' if i == n - 1 else "null"
            delta = f'"delta":{{"content":"{WORD}"}}' if chat else f'"text":"{WORD}"'
            await resp.write(f'data: {prefix}{{"index":0,{delta},"finish_reason":{finish}}}]}}\n\n'.encode())
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(f"data: {prefix}],{json.dumps({'usage': usage})[1:-1]}}}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def embeddings(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]} for i in range(len(inputs))]
        usage = {"prompt_tokens": len(inputs), "total_tokens": len(inputs)}
        return web.json_response({"object": "list", "data": data, "model": body.get("model"), "usage": usage})

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "mock"}]}
        )

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=f"# TYPE mock_served counter\nmock_served_total {self.served}\n")


def build(name: str = "mock", chunks: int = 20, delay_ms: float = 0) -> web.Application:
    mock = Mock(name, chunks, delay_ms / 1000)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", mock.chat)
    app.router.add_post("/v1/completions", mock.text)
    app.router.add_post("/v1/embeddings", mock.embeddings)
    app.router.add_get("/v1/models", mock.models)
    app.router.add_get("/health", mock.health)
    app.router.add_get("/metrics", mock.metrics)
    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--delay-ms", type=float, default=0)
    ap.add_argument("--name", default="mock")
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(
        build(args.name, args.chunks, args.delay_ms),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
    )


if __name__ == "__main__":
    main()
