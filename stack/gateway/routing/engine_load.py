"""What each local engine has on its plate, kept for the TTFT estimate (stack.gateway.routing.ttft_estimate).

Per deployment:
- the requests this gateway sent it that have no first token yet (a stream's first chunk ends that; a
  non-streamed answer is counted until the time its estimate said), with their prompt sizes: characters
  until the answer's usage says tokens, at the engine's learned characters per token;
- the TTFT line fitted through its finished streams: x = prompt tokens ahead at admission + its own,
  y = the TTFT the gateway saw;
- its own metrics, scraped every `scrape_interval_s` (vllm:num_requests_running/waiting, the prefill
  histograms' sums: the per-token cost before the gateway has a line, and the mean prompt size), parsed by
  the console's parser (stack.gateway.console.live).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from stack.config.sections.gateway import SpillSettings
from stack.gateway.prom_text import Scrape, parse
from stack.gateway.registry import Deployment
from stack.gateway.routing.ttft_estimate import (
    EngineLoad,
    Estimate,
    Line,
    TtftFit,
    engine_seconds_per_token,
    prompt_chars,
)

log = logging.getLogger("stack.gateway.routing.engine_load")


@dataclass(eq=False)
class Pending:
    """One request on an engine, from its admission to its end."""

    dep_id: str
    chars: int
    tokens: int  # estimated from chars until the usage says
    started: float
    ahead_tokens: int  # prompt tokens ahead of it when it was admitted
    first_by: float | None = None  # a non-streamed answer: when its first token is assumed (its estimate)
    ttft_s: float | None = None


@dataclass
class EngineBook:
    fit: TtftFit
    chars_per_token: float
    mean_prompt_tokens: float = 0.0
    answered: int = 0  # requests whose usage said their prompt tokens
    pending: set[Pending] = field(default_factory=set)
    scrape: Scrape | None = None
    engine_line: Line | None = None  # from the engine's own histograms, until `fit` has a line


class LoadBook:
    def __init__(self, settings: SpillSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self.engines: dict[str, EngineBook] = {}
        self._session: aiohttp.ClientSession | None = None

    def _of(self, dep_id: str) -> EngineBook:
        book = self.engines.get(dep_id)
        if book is None:
            fit = TtftFit(self.settings.half_life, self.settings.min_samples)
            book = self.engines[dep_id] = EngineBook(fit, self.settings.chars_per_token)
        return book

    # -- the request path -------------------------------------------------------------------------------
    def tokens_of(self, dep_id: str, body: dict[str, Any]) -> tuple[int, int]:
        """(characters, estimated prompt tokens) of a request body on this engine."""
        chars = prompt_chars(body)
        return chars, max(1, round(chars / self._of(dep_id).chars_per_token))

    def load(self, dep_id: str) -> EngineLoad:
        book, now = self._of(dep_id), self.clock()
        ahead = [p for p in book.pending if p.ttft_s is None and (p.first_by is None or now < p.first_by)]
        gauges = book.scrape.gauges if book.scrape is not None else {}
        running, waiting = gauges.get("vllm:num_requests_running"), gauges.get("vllm:num_requests_waiting")
        return EngineLoad(len(ahead), sum(p.tokens for p in ahead), None if running is None else int(running),
                          None if waiting is None else int(waiting), book.mean_prompt_tokens)  # fmt: skip

    def line(self, dep_id: str) -> Line | None:
        book = self._of(dep_id)
        return book.fit.line() or book.engine_line

    def begin(self, dep_id: str, body: dict[str, Any], stream: bool, est: Estimate | None = None) -> Pending:
        chars, tokens = self.tokens_of(dep_id, body)
        load, now = self.load(dep_id), self.clock()
        first_by = None if stream or est is None else now + est.seconds
        entry = Pending(dep_id, chars, tokens, now, load.tokens_ahead, first_by)
        self._of(dep_id).pending.add(entry)
        return entry

    def first(self, entry: Pending) -> None:
        entry.ttft_s = self.clock() - entry.started

    def end(self, entry: Pending, usage: dict | None) -> None:
        """The answer is complete (or failed): learn from it, forget it."""
        book = self._of(entry.dep_id)
        book.pending.discard(entry)
        prompt = (usage or {}).get("prompt_tokens", (usage or {}).get("input_tokens"))
        if not isinstance(prompt, int) or prompt <= 0:
            return
        book.answered += 1
        alpha = 1.0 / min(self.settings.half_life, book.answered)  # a running mean, then an exponential one
        if entry.chars > 0:  # characters per token, the chat template's own tokens included
            book.chars_per_token += alpha * (entry.chars / prompt - book.chars_per_token)
        book.mean_prompt_tokens += alpha * (prompt - book.mean_prompt_tokens)
        if entry.ttft_s is not None:
            book.fit.observe(entry.ahead_tokens + prompt, entry.ttft_s)

    def restarted(self, dep_id: str) -> None:
        """A new engine process behind the deployment (a cold start, a new port): the old one's requests and
        counters are gone; its line and characters per token stay (the same model, settings and machine), so a
        stopped model's next start is estimated from its last life."""
        book = self.engines.get(dep_id)
        if book is not None:
            book.pending.clear()
            book.scrape = None

    def forget(self, dep_id: str) -> None:
        """The deployment is gone."""
        self.engines.pop(dep_id, None)

    # -- the engine's own metrics -------------------------------------------------------------------------
    def take(self, dep_id: str, text: str) -> None:
        """One scrape of the engine's /metrics text."""
        book = self._of(dep_id)
        now = parse(text)
        if book.scrape is not None:
            per_token = engine_seconds_per_token(book.scrape.counters, now.counters)
            if per_token is not None:
                book.engine_line = Line(0.0, per_token, "engine metrics")
            before, after = book.scrape.counters, now.counters
            n = after.get("vllm:request_prompt_tokens_count", 0.0) - before.get("vllm:request_prompt_tokens_count", 0.0)
            if n > 0 and not book.mean_prompt_tokens:
                tokens = after["vllm:request_prompt_tokens_sum"] - before.get("vllm:request_prompt_tokens_sum", 0.0)
                book.mean_prompt_tokens = tokens / n
        book.scrape = now

    async def run(self, deployments: Callable[[], Iterable[Deployment]]) -> None:
        """Scrape every deployment `deployments()` names, every scrape_interval_s, until cancelled."""
        while True:
            deps = [d for d in deployments() if d.kind == "local" and d.api_base]
            await asyncio.gather(*(self._scrape(d) for d in deps), return_exceptions=True)
            await asyncio.sleep(self.settings.scrape_interval_s)

    async def _scrape(self, dep: Deployment) -> None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        try:
            async with self._session.get(f"{dep.api_base}/metrics", headers=dep.auth()) as resp:
                if resp.status != 200:
                    return
                text = (await resp.read()).decode(errors="replace")
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("metrics of %s not read: %s", dep.id, type(exc).__name__)
            return
        self.take(dep.id, text)

    async def close(self) -> None:
        if self._session is not None:
            with contextlib.suppress(Exception):
                await self._session.close()
