"""A paced stand-in for one vLLM engine whose capacity is set: `slots` sequences at once (max_num_seqs), each
token `token_ms` apart, the others waiting in its queue, first come first served, or by the request's
`priority` (lower first) as vLLM's --scheduling-policy priority orders its waiting queue (no preemption).

    python bench/harness/paced_engine.py --port 9200 --slots 4 --token-ms 50 [--policy priority]

Its capacity in requests/s is slots / (tokens x token_ms). For the gateway's tenant tests and
bench/tenant_fairness.py: what matters there is who waits where, not what is generated. Like vLLM, a request
with a `priority` other than 0 is refused (400) unless the policy is `priority`. Usage is reported as the
gateway estimates it (prompt characters / 4, rounded up) so a limit's arithmetic can be checked exactly.
GET /stats: the order requests got a sequence (`user` field or "-", and the priority each carried). A request
whose `user` starts with `hold` keeps its sequence until POST /release (tests: a queue that stays full).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import itertools
import json
import threading
import time
from collections.abc import Iterator

from aiohttp import web

WORD = "tok "


def prompt_tokens(body: dict) -> int:
    def chars(v: object) -> int:
        if isinstance(v, str):
            return len(v)
        if isinstance(v, list):
            return sum(chars(x) for x in v)
        if isinstance(v, dict):
            return chars(v.get("content")) + chars(v.get("text"))
        return 0

    return -(-(chars(body.get("messages")) + chars(body.get("prompt"))) // 4)


class PacedEngine:
    def __init__(self, slots: int, token_ms: float, policy: str = "fcfs", default_tokens: int = 16) -> None:
        self.slots, self.token_s, self.policy, self.default_tokens = slots, token_ms / 1000, policy, default_tokens
        self.running = 0
        self.waiting: list[tuple[int, int, asyncio.Future]] = []
        self.seq = itertools.count()
        self.started: list[dict] = []  # who got a sequence, in order
        self.max_running = 0
        self.held: asyncio.Event | None = None  # made on the server's loop

    async def _enter(self, priority: int) -> None:
        if self.running < self.slots and not self.waiting:
            self.running += 1
            return
        fut = asyncio.get_running_loop().create_future()
        key = priority if self.policy == "priority" else 0
        heapq.heappush(self.waiting, (key, next(self.seq), fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._leave()
            fut.cancel()
            raise

    def _leave(self) -> None:
        self.running -= 1
        while self.waiting and self.running < self.slots:
            _, _, fut = heapq.heappop(self.waiting)
            if not fut.done():
                self.running += 1
                fut.set_result(None)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        priority = body.get("priority", 0)
        if priority and self.policy != "priority":
            return web.json_response({"error": {"message": "priority can only be set with the priority scheduling "
                                                "policy", "type": "BadRequestError", "param": None, "code": 400}},
                                     status=400)  # fmt: skip
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or self.default_tokens)
        usage = {"prompt_tokens": prompt_tokens(body), "completion_tokens": n}
        usage["total_tokens"] = usage["prompt_tokens"] + n
        await self._enter(priority)
        try:
            self.max_running = max(self.max_running, self.running)
            self.started.append({"user": body.get("user", "-"), "priority": priority, "t": time.time()})
            if str(body.get("user", "")).startswith("hold"):
                self.held = self.held or asyncio.Event()
                await self.held.wait()
            return await self._answer(request, body, n, usage)
        finally:
            self._leave()

    async def _answer(self, request: web.Request, body: dict, n: int, usage: dict) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        start = loop.time()
        if not body.get("stream"):
            await asyncio.sleep(self.token_s * n)
            return web.json_response({"id": "paced", "object": "chat.completion", "created": int(time.time()),
                                      "model": body.get("model"), "usage": usage, "choices": [
                                          {"index": 0, "finish_reason": "length",
                                           "message": {"role": "assistant", "content": WORD * n}}]})  # fmt: skip
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        head = f'{{"id":"paced","object":"chat.completion.chunk","created":{int(time.time())},"model":"x","choices":['
        for i in range(n):
            await asyncio.sleep(max(0.0, start + self.token_s * (i + 1) - loop.time()))
            finish = '"length"' if i == n - 1 else "null"
            await resp.write(f'data: {head}{{"index":0,"delta":{{"content":"{WORD}"}},"finish_reason":{finish}}}]}}\n\n'
                             .encode())  # fmt: skip
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(f'data: {head}],"usage":{json.dumps(usage)}}}\n\n'.encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def stats(self, _: web.Request) -> web.Response:
        return web.json_response({"started": self.started, "running": self.running, "waiting": len(self.waiting),
                                  "max_running": self.max_running})  # fmt: skip

    async def release(self, _: web.Request) -> web.Response:
        self.held = self.held or asyncio.Event()
        self.held.set()
        return web.json_response({"released": True})

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/stats", self.stats)
        app.router.add_post("/release", self.release)
        app.router.add_get("/health", self.health)
        return app


@contextlib.contextmanager
def serving(engine: PacedEngine) -> Iterator[str]:
    """The engine on a free loopback port, its event loop in a thread of this process; yields its base URL."""
    from bench.harness.waiting import free_port

    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(engine.app(), access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--token-ms", type=float, default=50)
    ap.add_argument("--policy", choices=("fcfs", "priority"), default="fcfs")
    args = ap.parse_args()
    web.run_app(PacedEngine(args.slots, args.token_ms, args.policy).app(), host=args.host, port=args.port,
                print=None, access_log=None)  # fmt: skip


if __name__ == "__main__":
    main()
