"""The figures of bench/gateway_relay.py: each target's rounds tallied, then rows side by side with their ratios
to direct, and the verdict, which says first whether DIRECT reached the target (when it did not, the stand-ins
and the client processes are the limit, and the gateway's rows do not measure the goal)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.harness.relay_clients import Share
from bench.harness.stream_load import pct

GOAL_RATIO = 0.99  # issue 54: the gateway relays >= 0.99x direct's tokens/s
BUSY = 0.9  # a machine whose cores were this busy bounds what any target reached


@dataclass
class Tally:
    """One target over its rounds: direct (workers None) or the gateway with `workers` processes."""

    name: str
    workers: int | None = None
    rates: list[float] = field(default_factory=list)  # tokens/s of each round's window
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    window_s: float = 0.0
    window_tokens: int = 0
    streams: int = 0
    errors: int = 0
    short: int = 0
    first_error: str = ""
    cpu: dict[str, float] = field(default_factory=dict)  # party -> CPU seconds inside the windows

    def add(self, shares: list[Share], cpu: dict[str, float], window_s: float) -> None:
        tokens = sum(s.window_tokens for s in shares)
        self.rates.append(tokens / window_s)
        self.window_s += window_s
        self.window_tokens += tokens
        for s in shares:
            self.ttft += s.ttft
            self.e2e += s.e2e
            self.streams += s.streams
            self.errors += s.errors
            self.short += s.short
            self.first_error = self.first_error or s.first_error
        for party, seconds in cpu.items():
            self.cpu[party] = self.cpu.get(party, 0.0) + seconds

    @property
    def rate(self) -> float:
        return sum(self.rates) / len(self.rates) if self.rates else 0.0

    def cores(self, party: str) -> float:
        return self.cpu.get(party, 0.0) / self.window_s if self.window_s else 0.0


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b and a == a and b == b else None  # x == x: not NaN


def row(t: Tally, direct: Tally) -> dict:
    p50, p99 = pct(t.ttft, 50) * 1000, pct(t.ttft, 99) * 1000
    gateway_ms = 1000 * t.cpu.get("gateway", 0.0) / t.window_tokens * 1000 if t.window_tokens else None
    return {
        "target": t.name,
        "workers": t.workers,
        "tokens_per_s": round(t.rate),
        "tokens_per_s_rounds": [round(r) for r in t.rates],
        "x_direct": _ratio(t.rate, direct.rate),
        "ttft_p50_ms": round(p50, 1),
        "ttft_p99_ms": round(p99, 1),
        "ttft_p50_x_direct": _ratio(p50, pct(direct.ttft, 50) * 1000),
        "ttft_p99_x_direct": _ratio(p99, pct(direct.ttft, 99) * 1000),
        "stream_p50_ms": round(pct(t.e2e, 50) * 1000, 1),
        "stream_p99_ms": round(pct(t.e2e, 99) * 1000, 1),
        "gateway_cpu_ms_per_1k_tokens": round(gateway_ms, 2) if t.workers and gateway_ms is not None else None,
        "cores": {party: round(t.cores(party), 2) for party in sorted(t.cpu)},
        "streams": t.streams,
        "errors": t.errors,
        "short_streams": t.short,
        "first_error": t.first_error,
    }


def verdict(tallies: list[Tally], offered: float, target: float, cores: int) -> list[str]:
    """What the rows say about the goal (>= `target` tok/s at >= 0.99x direct), in sentences."""
    direct = tallies[0]
    lines = [f"offered {offered:,.0f} tok/s (streams x 1000 / cadence-ms); target {target:,.0f} tok/s at "
             f">= {GOAL_RATIO}x direct; {cores} CPU cores"]  # fmt: skip
    limit = (f"the stand-ins ({direct.cores('stand-ins'):.1f} cores) and the client processes "
             f"({direct.cores('clients'):.1f} cores) are the limit here, not the gateway")  # fmt: skip
    reached = direct.rate >= target
    if offered < target:
        lines.append(f"the offer ({offered:,.0f} tok/s) is below the target: this run does not measure the goal "
                     f"(more --streams or a shorter --cadence-ms)")  # fmt: skip
    elif not reached:
        lines.append(f"DIRECT reached {direct.rate:,.0f} tok/s, below the target {target:,.0f}: {limit}; the gateway "
                     f"rows do not measure the goal (more --standins/--clients, or more cores)")  # fmt: skip
    if reached and direct.rate < 0.95 * offered:
        lines.append(f"direct reached {direct.rate:,.0f} of the {offered:,.0f} tok/s offered: {limit} above that")
    if direct.cores("machine") >= BUSY * cores:
        lines.append(f"direct: the machine's cores were busy ({direct.cores('machine'):.1f} of {cores})")
    for t in tallies[1:]:
        x = _ratio(t.rate, direct.rate) or 0.0
        line = f"{t.name}: {t.rate:,.0f} tok/s = {x:.3f}x direct"
        if reached:
            met = t.rate >= target and x >= GOAL_RATIO
            line += f": the goal is {'met' if met else 'NOT met'}"
        if t.cores("machine") >= BUSY * cores:
            line += f" (the machine's cores were busy, {t.cores('machine'):.1f} of {cores}: it bounds the ratio)"
        lines.append(line)
    for t in tallies:
        if t.errors or t.short:
            lines.append(f"{t.name}: {t.errors} failed streams, {t.short} streams whose chunks differ from their "
                         f"usage (first error: {t.first_error or 'none'})")  # fmt: skip
    return lines


def table(rows: list[dict]) -> list[str]:
    """The rows as the terminal shows them."""
    out = [f"{'target':<11} {'tok/s':>9} {'x dir':>6} {'TTFT p50':>9} {'x dir':>6} {'TTFT p99':>9} {'x dir':>6} "
           f"{'str p99':>8} {'gw CPU':>7} {'cores gw/stand-ins/clients/machine':>35} {'err':>4}"]  # fmt: skip

    def x(v: float | None) -> str:
        return f"{v:>6.3f}" if v is not None else f"{'-':>6}"

    for r in rows:
        c = r["cores"]
        cores = "/".join(f"{c[p]:.1f}" if p in c else "-" for p in ("gateway", "stand-ins", "clients", "machine"))
        gw = f"{r['gateway_cpu_ms_per_1k_tokens']:>5.1f}ms" if r["gateway_cpu_ms_per_1k_tokens"] is not None else "-"
        bad = r["errors"] + r["short_streams"]
        out.append(f"{r['target']:<11} {r['tokens_per_s']:>9,} {x(r['x_direct'])} {r['ttft_p50_ms']:>7.1f}ms "
                   f"{x(r['ttft_p50_x_direct'])} {r['ttft_p99_ms']:>7.1f}ms {x(r['ttft_p99_x_direct'])} "
                   f"{r['stream_p99_ms']:>6.0f}ms {gw:>7} {cores:>35} {bad:>4}")  # fmt: skip
    out.append("gw CPU: the gateway's CPU (owner + workers) per 1,000 relayed tokens; str p99: a stream's length")
    return out
