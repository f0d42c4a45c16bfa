"""Each tenant's limits, checked before a request reaches an engine: rpm, tpm, concurrent, tokens per day,
a token budget and a money budget.

Tokens are reserved when a request is admitted (its prompt estimated at 4 characters a token, plus its
max_tokens or the admission's default) and settled on the usage its answer reports, so a window never holds
more than the limit while answers are running, and holds what was really used once they end. Windows slide
over 60 s (rpm, tpm); the day is the UTC day; the budgets count across restarts (stack.gateway.tenants.usage
keeps them in state_dir/usage.json).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from stack.config.sections.tenants import TenantLimits
from stack.gateway.endpoints import BY_NAME

WINDOW_S = 60.0
CHARS_PER_TOKEN = 4


class OverLimit(Exception):
    """A limit the request would break: its name (rpm, tpm, ...), when to retry (None: not by waiting)."""

    def __init__(self, limit: str, message: str, retry_after_s: float | None) -> None:
        super().__init__(message)
        self.limit, self.message = limit, message
        self.retry_after = None if retry_after_s is None else max(1, math.ceil(retry_after_s))
        # OpenAI's clients read `retry-after-ms` before Retry-After: to the millisecond, a client that waits
        # as told is admitted as the window frees (what keeps a tenant at its limit, not 1 s below it)
        self.retry_after_ms = None if retry_after_s is None else max(1, math.ceil(retry_after_s * 1000))


@dataclass
class Meter:
    """One tenant's use: the windows the limits read, and its totals."""

    requests: deque[float] = field(default_factory=deque)
    tokens: deque[list] = field(default_factory=deque)  # [admitted at, tokens, still in the window]
    window_tokens: int = 0
    in_flight: int = 0
    day: str = ""
    day_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float = 0.0

    def expire(self, now: float) -> None:
        edge = now - WINDOW_S
        while self.requests and self.requests[0] <= edge:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= edge:
            entry = self.tokens.popleft()
            entry[2] = False
            self.window_tokens -= entry[1]

    def roll_day(self, now: float) -> None:
        today = time.strftime("%Y-%m-%d", time.gmtime(now))
        if today != self.day:
            self.day, self.day_tokens = today, 0


@dataclass
class Hold:
    """What one admitted request holds of its tenant's limits, given back once."""

    meter: Meter
    estimate: int
    entry: list
    day: str
    settled: bool = False
    released: bool = False

    def settle(self, used: int | None, cost_usd: float = 0.0) -> None:
        """Its real tokens replace the estimate (None: no usage reported, the estimate stays)."""
        m = self.meter
        m.cost_usd += cost_usd
        if self.settled or used is None:
            return
        self.settled = True
        delta = used - self.estimate
        if self.entry[2]:
            self.entry[1] += delta
            m.window_tokens += delta
        if m.day == self.day:
            m.day_tokens += delta
        m.total_tokens += delta

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.meter.in_flight -= 1


class Limiter:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.meters: dict[str, Meter] = {}

    def meter(self, name: str) -> Meter:
        m = self.meters.get(name)
        if m is None:
            m = self.meters[name] = Meter()
        return m

    def breach(self, name: str, limits: TenantLimits, estimate: int) -> OverLimit | None:
        """The first limit this request would break (in the order a client can act on), or None."""
        now, m = self.clock(), self.meter(name)
        m.expire(now)
        m.roll_day(now)
        if limits.budget_usd is not None and m.cost_usd >= limits.budget_usd:
            return OverLimit(
                "budget_usd",
                f"key {name!r} has spent its budget of ${limits.budget_usd:g} "
                f"(${m.cost_usd:.4f}); an admin raises it: vstack keys add {name} --replace ...",
                None,
            )
        if limits.token_budget is not None and m.total_tokens + estimate > limits.token_budget:
            return OverLimit(
                "token_budget",
                f"key {name!r} has used {m.total_tokens} of its token budget of "
                f"{limits.token_budget}; an admin raises it: vstack keys add {name} --replace ...",
                None,
            )
        if limits.concurrent is not None and m.in_flight >= limits.concurrent:
            return OverLimit(
                "concurrent",
                f"key {name!r} has {m.in_flight} requests in flight, its limit "
                f"(concurrent {limits.concurrent}); retry when one ends",
                1,
            )
        if limits.rpm is not None and len(m.requests) >= limits.rpm:
            return OverLimit(
                "rpm",
                f"key {name!r} is at its limit of {limits.rpm} requests per minute",
                m.requests[0] + WINDOW_S - now,
            )
        if limits.tpm is not None:
            if estimate > limits.tpm:
                return OverLimit(
                    "tpm",
                    f"this request counts {estimate} tokens (its prompt and max_tokens), more "
                    f"than key {name!r} may use in a minute ({limits.tpm}); lower max_tokens",
                    None,
                )
            if m.window_tokens + estimate > limits.tpm:
                return OverLimit(
                    "tpm",
                    f"key {name!r} is at its limit of {limits.tpm} tokens per minute "
                    f"({m.window_tokens} used or reserved, this request counts {estimate})",
                    self._tokens_free_in(m, limits.tpm - estimate, now),
                )
        if limits.tokens_per_day is not None and m.day_tokens + estimate > limits.tokens_per_day:
            midnight = (math.floor(now / 86400) + 1) * 86400
            return OverLimit(
                "tokens_per_day",
                f"key {name!r} has used {m.day_tokens} of its {limits.tokens_per_day} tokens today (UTC)",
                midnight - now,
            )
        return None

    @staticmethod
    def _tokens_free_in(m: Meter, room: int, now: float) -> float:
        """Seconds until the window holds at most `room` tokens (the oldest entries leave first)."""
        held = m.window_tokens
        for at, tokens, _ in m.tokens:
            held -= tokens
            if held <= room:
                return at + WINDOW_S - now
        return WINDOW_S

    def hold(self, name: str, estimate: int) -> Hold:
        now, m = self.clock(), self.meter(name)
        m.roll_day(now)
        m.requests.append(now)
        entry = [now, estimate, True]
        m.tokens.append(entry)
        m.window_tokens += estimate
        m.day_tokens += estimate
        m.total_tokens += estimate
        m.in_flight += 1
        return Hold(m, estimate, entry, m.day)


def estimate_tokens(endpoint: str, body: dict, default_output: int) -> int:
    """Prompt characters / 4 plus the tokens it may generate: what a request is counted as until its usage."""
    chars = _chars(body.get("messages")) + _chars(body.get("prompt")) + _chars(body.get("input"))
    prompt = -(-chars // CHARS_PER_TOKEN)
    entry = BY_NAME.get(endpoint)
    if entry is not None and entry.pools:  # embeddings, scores: nothing generated
        return max(prompt, 1)
    out = body.get("max_completion_tokens", body.get("max_tokens"))
    return prompt + (out if isinstance(out, int) and out >= 0 else default_output)


def _chars(value: object) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    if isinstance(value, dict):  # a message ({role, content}) or a content part ({type: text, text})
        return _chars(value.get("content")) + _chars(value.get("text"))
    return 0
