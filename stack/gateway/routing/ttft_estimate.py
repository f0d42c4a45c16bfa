"""Will a request's first token come within its model's SLO? The estimate and the spill decision, pure.

On a local engine a request's time to first token is, to a first order, the prefill of every prompt ahead of
it that has no first token yet, plus its own, at the engine's prefill speed, plus a fixed part (an engine
step, the HTTP hops) and, for a model that is not awake, what its switch still takes:

    ttft ≈ switch_s + fixed_s + (tokens_ahead + own_tokens) x s_per_token

`fixed_s` and `s_per_token` are a line fitted per engine through its recent requests' (tokens, TTFT) points
(`TtftFit`: least squares with exponential forgetting, so the line follows the engine's load and decode
interference). Before an engine has streamed enough requests, vLLM's own histograms give the per-token cost
(`engine_seconds_per_token`: vllm:request_prefill_time_seconds over vllm:request_prefill_kv_computed_tokens).
No line and no engine figure: no estimate, and the request is served locally as before.

A request is spilled to its model's fallbacks when the estimate exceeds `headroom` x the SLO's TTFT limit.
Nothing here reads a clock or does I/O (tests/gateway/test_ttft_estimate.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from stack.config.slo import Clause

# A fitted line is used only within what it has seen: a cost per token below this is noise (a 2-core CPU
# prefills ~10k tokens/s of a 135M model; an H100 ~100k of an 8B), and never a negative fixed part.
MIN_S_PER_TOKEN = 1e-7


@dataclass(frozen=True)
class Line:
    fixed_s: float
    s_per_token: float
    basis: str  # "fit of N requests" or "engine metrics"

    @property
    def tokens_per_s(self) -> float:
        return 1.0 / self.s_per_token

    def at(self, tokens: float) -> float:
        return self.fixed_s + tokens * self.s_per_token


class TtftFit:
    """y = a + b x through (tokens, seconds) points, each weighted down by half every `half_life` points.

    O(1) per point (running weighted sums). `line()` is None until `min_points` (weighted) are in; a cloud of
    points with no spread in x gives the line through the origin and their mean (no slope can be told)."""

    def __init__(self, half_life: int = 200, min_points: int = 8) -> None:
        self.decay = 0.5 ** (1.0 / max(1, half_life))
        self.min_points = min_points
        self.n = self.sx = self.sy = self.sxx = self.sxy = 0.0
        self.count = 0

    def observe(self, tokens: float, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0 or math.isnan(seconds):
            return
        d = self.decay
        self.n, self.sx, self.sy = self.n * d + 1, self.sx * d + tokens, self.sy * d + seconds
        self.sxx, self.sxy = self.sxx * d + tokens * tokens, self.sxy * d + tokens * seconds
        self.count += 1

    def line(self) -> Line | None:
        if self.count < self.min_points or self.n <= 0:
            return None
        mx, my = self.sx / self.n, self.sy / self.n
        var = self.sxx / self.n - mx * mx
        basis = f"fit of the last {self.count if self.count < 1000 else '1000+'} requests"
        if var > (0.05 * mx) ** 2:  # x spread enough to tell a slope from the noise
            slope = (self.sxy / self.n - mx * my) / var
            if slope >= MIN_S_PER_TOKEN:
                fixed = my - slope * mx
                if fixed >= 0:
                    return Line(fixed, slope, basis)
                return Line(0.0, self.sxy / self.sxx, basis)  # the line crosses below 0: through the origin
        return Line(0.0, max(MIN_S_PER_TOKEN, my / mx), basis) if mx > 0 else None


def engine_seconds_per_token(before: Mapping[str, float], after: Mapping[str, float]) -> float | None:
    """Prefill seconds per computed prompt token of the requests an engine finished between two scrapes, from
    its histogram sums (`vllm:request_prefill_time_seconds_sum`, `vllm:request_prefill_kv_computed_tokens_sum`;
    older vLLMs lack the second: `vllm:prompt_tokens_total` instead). None without new requests."""
    time_key = "vllm:request_prefill_time_seconds_sum"
    for tokens_key in ("vllm:request_prefill_kv_computed_tokens_sum", "vllm:prompt_tokens_total"):
        if tokens_key in after and time_key in after:
            tokens = after[tokens_key] - before.get(tokens_key, 0.0)
            seconds = after[time_key] - before.get(time_key, 0.0)
            if tokens > 0 and seconds > 0:
                return max(MIN_S_PER_TOKEN, seconds / tokens)
            return None
    return None


@dataclass(frozen=True)
class EngineLoad:
    """What is ahead of a new request on one engine, now."""

    requests_ahead: int  # sent by this gateway, no first token yet
    tokens_ahead: int  # ... their prompt tokens (estimated from characters until the engine said)
    running: int | None = None  # vllm:num_requests_running at the last scrape
    waiting: int | None = None  # vllm:num_requests_waiting at the last scrape
    mean_prompt_tokens: float = 0.0  # of this engine's recent requests

    def with_engine_queue(self) -> EngineLoad:
        """Requests the engine holds waiting that this gateway did not count (another client, a gateway
        restarted beside a running engine) are ahead too, at the mean prompt size."""
        extra = max(0, (self.waiting or 0) - self.requests_ahead)
        if not extra:
            return self
        return EngineLoad(self.requests_ahead + extra, self.tokens_ahead + int(extra * self.mean_prompt_tokens),
                          self.running, self.waiting, self.mean_prompt_tokens)  # fmt: skip


@dataclass(frozen=True)
class Estimate:
    seconds: float
    switch_s: float
    queue_s: float  # the prompts ahead
    own_s: float  # this prompt, with the line's fixed part
    requests_ahead: int
    tokens_ahead: int
    own_tokens: int
    line: Line

    def describe(self) -> str:
        parts = [f"{self.requests_ahead} ahead ({self.tokens_ahead} tok)", f"own {self.own_tokens} tok",
                 f"{self.line.tokens_per_s:,.0f} tok/s ({self.line.basis})"]  # fmt: skip
        if self.switch_s:
            parts.insert(0, f"switch {self.switch_s:.2f} s")
        return f"estimate {self.seconds:.2f} s: " + ", ".join(parts)


def estimate(load: EngineLoad, own_tokens: int, line: Line | None, switch_s: float = 0.0) -> Estimate | None:
    """TTFT of a new request of `own_tokens` on an engine with `load`; None without a line to estimate by."""
    if line is None:
        return None
    load = load.with_engine_queue()
    queue_s = load.tokens_ahead * line.s_per_token
    own_s = line.at(own_tokens)
    return Estimate(switch_s + queue_s + own_s, switch_s, queue_s, own_s, load.requests_ahead, load.tokens_ahead,
                    own_tokens, line)  # fmt: skip


# -- the decision -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    spill: bool
    reason: str  # a label: within_slo, over_slo, no_estimate, no_fallback
    why: str  # one line for the Activity log and the logs
    estimate: Estimate | None = None


def decide(est: Estimate | None, limit: Clause, *, headroom: float, has_fallback: bool) -> Verdict:
    """Spill when the estimate breaks `headroom` x the SLO's TTFT limit and there is somewhere to spill to."""
    bound_s = limit.limit / 1000 * headroom
    if est is None:
        return Verdict(False, "no_estimate", f"no TTFT estimate yet for {limit}: served locally")
    if est.seconds <= bound_s:
        return Verdict(False, "within_slo", f"{est.describe()} <= {bound_s:.2f} s ({limit})", est)
    if not has_fallback:
        return Verdict(False, "no_fallback", f"{est.describe()} > {bound_s:.2f} s ({limit}), no fallback", est)
    return Verdict(True, "over_slo", f"{est.describe()} > {bound_s:.2f} s ({limit}): spilled", est)


def ttft_limit(clauses: Iterable[Clause]) -> Clause | None:
    """The clause a spill keeps: the tightest upper bound on a TTFT percentile (p95_ttft_ms<800); None when
    the SLO bounds no TTFT (other clauses are for `vstack tune` and load tests only)."""
    bounds = [c for c in clauses if c.upper_bound and c.metric.endswith("_ttft_ms")]
    return min(bounds, key=lambda c: c.limit) if bounds else None


# -- how big is a prompt, before any tokenizer has seen it ---------------------------------------------------
def prompt_chars(body: Mapping[str, Any]) -> int:
    """Characters of the text a request asks the engine to prefill: chat messages (text parts), a completion
    prompt, a Responses `input` or Anthropic `system` + messages. Images and tool schemas are not counted."""
    total = 0
    for key in ("messages", "prompt", "input", "system", "instructions"):
        total += _chars(body.get(key))
    return total


def _chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    if isinstance(value, dict):
        return _chars(value.get("content")) + _chars(value.get("text"))
    return 0
