"""What the tenant benches share (bench/tenant_fairness.py, bench/tenant_limits.py): the named keys, the paced
stand-in engine as a child process, a gateway app with named keys and admission, and the metered client that
sends as fast as its tpm limit lets it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import threading
import time

import aiohttp

from bench.harness.children import Children
from bench.harness.waiting import free_port

MODEL = "shared"
METERED = "metered"
KEYS = {"quiet": "quiet-key-000000001", "noisy": "noisy-key-000000002", "metered": "metered-key-00000003"}


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def start_engine(children: Children, name: str, slots: int, token_ms: float, policy: str = "fcfs") -> tuple:
    port = free_port()
    argv = [sys.executable, "bench/harness/paced_engine.py", "--port", str(port), "--slots", str(slots),
            "--token-ms", str(token_ms), "--policy", policy]  # fmt: skip
    child = children.start(name, argv)
    child.wait_http(f"http://127.0.0.1:{port}/health", 30)
    return child, f"http://127.0.0.1:{port}"


def gateway_app(phase: str, engine_url: str, slots: int, group: str = MODEL, tenants: list[dict] | None = None):
    from stack.config.sections.gateway import GatewayConfig
    from stack.gateway.app import create_app
    from stack.gateway.registry import Deployment, DeploymentRegistry

    registry = DeploymentRegistry()
    labels = {"scheduling": "priority"} if phase == "vllm-priority" else {}
    registry.add(Deployment(id="engine", model_group=group, kind="local", upstream_model=group, api_base=engine_url,
                            labels=labels))  # fmt: skip
    quiet_class = "high" if phase == "vllm-priority" else "normal"
    tenants = tenants or [{"name": "quiet", "sha256": sha(KEYS["quiet"]), "priority": quiet_class},
                          {"name": "noisy", "sha256": sha(KEYS["noisy"])}]  # fmt: skip
    admission = {"enabled": phase.startswith("fair"), "max_in_engine": slots, "reserve": int(phase == "fair-reserve"),
                 "max_queued_per_tenant": 64, "queue_timeout_s": 600}  # fmt: skip
    cfg = GatewayConfig(tenants=tenants, admission=admission, liveness={"enabled": False}, spill={"enabled": False},
                        max_in_flight=100_000)  # fmt: skip
    return create_app(cfg, default_model=group, registry=registry, environ={})


def body(user: str, tokens: int, group: str = MODEL, content: str = "tenant fairness bench prompt") -> bytes:
    return json.dumps({"model": group, "messages": [{"role": "user", "content": content}], "max_tokens": tokens,
                       "stream": True, "stream_options": {"include_usage": True}, "user": user}).encode()  # fmt: skip


class Metered:
    """The tpm tenant: `loops` loops sending as fast as the limit lets (again at once after an answer, after a
    429 when its retry-after-ms says), for the whole run."""

    def __init__(self, url: str, tokens: int, content: str, loops: int = 4) -> None:
        self.url, self.tokens, self.content, self.loops = url, tokens, content, loops
        self.admitted: list[tuple[float, int]] = []  # (sent at, tokens used)
        self.refused = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.t0 = self.t1 = 0.0

    async def _run(self) -> None:
        self.t0 = time.time()
        data = body("m", self.tokens, METERED, self.content)
        headers = {"Authorization": f"Bearer {KEYS['metered']}", "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as session:

            async def loop() -> None:
                while not self.stop.is_set():
                    sent = time.time()
                    async with session.post(f"{self.url}/v1/chat/completions", data=data, headers=headers) as r:
                        text = await r.text()
                    if r.status == 200:
                        usage = [json.loads(line[6:]).get("usage") for line in text.splitlines()
                                 if line.startswith("data: {") and '"usage"' in line]  # fmt: skip
                        self.admitted.append((sent, usage[-1]["total_tokens"] if usage and usage[-1] else 0))
                    else:  # waits as told, to the millisecond (OpenAI's clients read retry-after-ms too)
                        self.refused += 1
                        await asyncio.sleep(min(1.0, int(r.headers.get("retry-after-ms", "50")) / 1000))

            await asyncio.gather(*(loop() for _ in range(self.loops)))
