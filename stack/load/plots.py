"""PNG plots of a load run: latency percentiles over time (with SLO limits drawn in) and throughput."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from stack.config.slo import Clause
from stack.load.summary import Window

TITLES = {"ttft": "time to first token", "itl": "inter-token latency", "e2e": "end-to-end latency"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def latency_plot(windows: Sequence[Window], clauses: Sequence[Clause], path: Path, title: str) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    xs = [w.start_s for w in windows]
    for ax, metric in zip(axes, TITLES, strict=True):
        for p, style in ((50, "-"), (95, "--"), (99, ":")):
            ys = [w.latency[metric][p] for w in windows]
            ax.plot(xs, [y if not math.isnan(y) else None for y in ys], style, marker=".", label=f"p{p}")
        for c in clauses:
            if c.metric.endswith(f"_{metric}_ms"):
                ax.axhline(c.limit, color="red", linewidth=1, alpha=0.7, label=f"SLO {c}")
        ax.set_ylabel(f"{TITLES[metric]} (ms)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("seconds since the first request (by completion)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def throughput_plot(windows: Sequence[Window], path: Path, title: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    xs = [w.start_s for w in windows]
    ax.plot(xs, [w.output_tokens_per_s for w in windows], marker=".", label="output tokens/s")
    ax.set_xlabel("seconds since the first request")
    ax.set_ylabel("output tokens/s")
    ax.grid(alpha=0.3)
    right = ax.twinx()
    right.bar(xs, [w.requests for w in windows], width=(xs[1] - xs[0]) * 0.8 if len(xs) > 1 else 0.8,
              alpha=0.2, color="grey", label="requests done")
    errors = [w.errors for w in windows]
    if any(errors):
        right.bar(xs, errors, width=(xs[1] - xs[0]) * 0.8 if len(xs) > 1 else 0.8, alpha=0.6, color="red",
                  label="errors")
    right.set_ylabel("requests per window")
    lines, labels = ax.get_legend_handles_labels()
    more, more_labels = right.get_legend_handles_labels()
    ax.legend(lines + more, labels + more_labels, loc="upper left", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def goodput_plot(curves: dict[str, list[dict]], clauses: Sequence[Clause], path: Path, title: str) -> Path:
    """Offered rate -> p50 (solid) and p95 (dashed) TTFT, TPOT and E2E, one colour per candidate, SLO limits in
    red: where a candidate's p95 crosses its limit is its goodput."""
    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(9, 10), sharex=True)
    for ax, metric in zip(axes, ("ttft", "tpot", "e2e"), strict=True):
        for i, (label, points) in enumerate(curves.items()):
            pts = sorted((p for p in points if p.get("rate") is not None), key=lambda p: p["rate"])
            if not pts:
                continue
            colour = f"C{i % 10}"
            xs = [p["rate"] for p in pts]
            for q, style in ((50, "-"), (95, "--")):
                ys = [(p["metrics"] or {}).get(f"p{q}_{metric}_ms") for p in pts]
                ax.plot(xs, ys, style, color=colour, marker="o" if q == 95 else ".",
                        label=f"{label} p{q}" if metric == "ttft" else None)
        for c in clauses:
            if c.metric.endswith(f"_{metric}_ms"):
                ax.axhline(c.limit, color="red", linewidth=1, alpha=0.7, label=f"SLO {c}")
        ax.set_ylabel(f"{metric.upper()} (ms)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=7)
    axes[-1].set_xlabel("offered request rate (req/s, open loop)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
