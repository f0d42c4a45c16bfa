"""The GPU switch bench's summary (bench/switch_gpu.py, `bench/switch_time.py --gpu`): per direction and side the
median of the steady rounds and their spread, the ratios to raw vLLM and to the overlapped bus, the first switch
after a start; and the small table a newcomer reads at the end of
`bash bench/gpu/switch_time.sh pair 5 handoff-overlap,raw` (docs/guides/switching.md says what each column means).

    python3 -m bench.harness.switch_summary bench/results/<run>/switch_time_gpu_<tag>.json   # a recorded run's table
    python3 -m bench.harness.switch_summary A.json B.json   # one side per call on one machine, as one table
    python3 -m bench.harness.switch_summary A.json B.json --out A-B.json   # ... and the merged run kept, with
                                                          # its summary, the files it came from and each call's bus
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def spread(xs: list[float]) -> dict[str, float]:
    """The rounds' range and, from four rounds on, their middle half: what a rerun may expect around the median."""
    xs = sorted(xs)
    out = {"min": round(xs[0], 3), "max": round(xs[-1], 3), "n": len(xs)}
    if len(xs) >= 4:
        q = statistics.quantiles(xs, n=4)
        out.update(p25=round(q[0], 3), p75=round(q[2], 3))
    return out


def median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


SIDES = ("vstack", "vstack-sequential", "vstack-handoff", "vstack-handoff-overlap", "vstack-handoff-warm",
         "vstack-handoff-spare", "vstack-handoff-kept", "raw-patched", "raw")  # fmt: skip


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Per direction: median totals of each side, the ratio ours / raw, and the bus limit beside them.

    Round 0 is a warm-up on every side and is left out of the medians (kept in `first_round`): it holds each
    engine's first sleep after its start (pinned host buffers allocated, 4-8 s on either side) and first wake.
    With a single round there is nothing else, so it is used."""
    out: dict[str, Any] = {}
    rounds = {s.get("round", 0) for s in result["switches"]}
    for s in result["switches"]:
        key = f"{s.get('from')}->{s['to']}"
        row = out.setdefault(key, {**{side: [] for side in SIDES}, "bus": s.get("bus"), "first_round": {}})
        if s.get("round", 0) == 0:
            row["first_round"][s["side"]] = s["total_s"]
        if s.get("round", 0) > 0 or rounds == {0}:
            row[s["side"]].append(s["total_s"])
    for row in out.values():
        row["runs"] = max(len(row[side]) for side in SIDES)
        row["max"] = {side: max(row[side]) for side in SIDES if row[side]}
        row["spread"] = {side: spread(row[side]) for side in SIDES if row[side]}
        for side in SIDES:
            row[side] = median(row[side])
        ours = [row[side] for side in SIDES if side.startswith("vstack") and row[side]]
        row["best_vstack"] = min(ours) if ours else None
        row["ratio_vstack_to_raw"] = round(row["vstack"] / row["raw"], 3) if row["vstack"] and row["raw"] else None
        row["ratio_best_to_raw"] = round(row["best_vstack"] / row["raw"], 3) if ours and row["raw"] else None
        # Against the floor too: the weights moved over the bus, both ways at once (issue 58: <= 1.2x).
        floor = (row.get("bus") or {}).get("overlapped_s")
        row["ratio_to_overlapped_bus"] = {side: round(row[side] / floor, 3) for side in SIDES
                                          if row[side] and floor}  # fmt: skip
    # The first switch of each side after its engines started (issue 37: 7.0 s against 0.50-0.70 s steady on an
    # H100, its sleep allocating the pinned host buffers), beside the steady median of the same direction.
    first: dict[str, Any] = {}
    for s in result["switches"]:
        if s["side"] in first:
            continue
        key = f"{s.get('from')}->{s['to']}"
        steady = out.get(key, {}).get(s["side"])
        first[s["side"]] = {"switch": key, "total_s": s["total_s"], "phases": s.get("phases"),
                            "steady_median_s": steady,
                            "ratio_to_steady": round(s["total_s"] / steady, 3) if steady else None}  # fmt: skip
    out["_first_switch_after_start"] = first
    cold = [s for s in result["switches"] if s["side"].startswith("vstack") and s.get("kind") == "cold"]
    out["_checks"] = {"cold_starts_in_switches": len(cold),
                      "first_switch_le_1.2x_steady": all((f["ratio_to_steady"] or 9) <= 1.2 for side, f in
                                                         first.items() if side.startswith("vstack")),
                      "every_switch_le_raw": all((r["ratio_best_to_raw"] or 9) <= 1.0 for k, r in out.items()
                                                 if not k.startswith("_")),
                      "every_switch_le_half_raw": all((r["ratio_best_to_raw"] or 9) <= 0.5 for k, r in out.items()
                                                      if not k.startswith("_"))}  # fmt: skip
    return out


# Sides in the order a reader compares them: ours first, raw vLLM last (bench.switch_gpu.SIDES plus variants).
ORDER = ("vstack-handoff-overlap", "vstack-handoff-warm", "vstack-handoff-spare", "vstack-handoff-kept",
         "vstack-handoff", "vstack",
         "vstack-sequential", "raw-patched", "raw")  # fmt: skip
HEAD = ("switch", "side", "median s", "min-max s (n)", "p25-p75 s", "x raw", "x bus", "first x steady")


def _num(value: float | None, digits: int = 3, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _sides(row: dict[str, Any]) -> list[str]:
    present = [s for s in row.get("spread", {})]
    return [s for s in ORDER if s in present] + sorted(s for s in present if s not in ORDER)


def rows(summary: dict[str, Any]) -> list[tuple[str, ...]]:
    """One line per direction and side: median, spread, ratios to raw vLLM and to the overlapped bus, and the
    side's first switch after its start over its steady median (on the direction that first switch took)."""
    first = summary.get("_first_switch_after_start", {})
    out = []
    for key, row in summary.items():
        if key.startswith("_"):
            continue
        raw = row.get("raw")
        for side in _sides(row):
            med, sp = row.get(side), row["spread"][side]
            quart = f"{sp['p25']:.3f}-{sp['p75']:.3f}" if "p25" in sp else "-"
            to_raw = None if side == "raw" or not (med and raw) else round(med / raw, 3)
            to_bus = (row.get("ratio_to_overlapped_bus") or {}).get(side)
            f = first.get(side, {})
            first_ratio = _num(f.get("ratio_to_steady"), 2, "x") if f.get("switch") == key else ""
            out.append((key, side, _num(med), f"{sp['min']:.3f}-{sp['max']:.3f} ({sp['n']})", quart,
                        _num(to_raw, 2, "x"), _num(to_bus, 2, "x"), first_ratio))  # fmt: skip
    return out


def table(result: dict[str, Any]) -> str:
    """The printed summary: the table, the bus it is measured against, the first switches and the goals. The
    summary is computed afresh from the recorded switches, so a run recorded before a column existed has it too."""
    summary = summarize(result)
    body = rows(summary)
    widths = [max(len(r[i]) for r in [HEAD, *body]) for i in range(len(HEAD))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [HEAD, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    bus = result.get("bus") or {}
    if "h2d_gbps" in bus:
        lines.append(f"bus (pinned copy, {bus['gib']:g} GiB): host->GPU {bus['h2d_gbps']} GB/s, GPU->host "
                     f"{bus['d2h_gbps']} GB/s, both at once {bus['duplex_each_gbps']} GB/s each")  # fmt: skip
    for key, row in summary.items():
        b = row.get("bus") or {} if not key.startswith("_") else {}
        if b.get("overlapped_s"):
            extra = f", the incoming weights alone {b['in_only_s']:.3f} s" if b.get("in_only_s") else ""
            lines.append(f"  {key}: the weights moved over the bus take {b['sequential_s']:.3f} s one way after the "
                         f"other, {b['overlapped_s']:.3f} s both at once (the base of `x bus`){extra}")  # fmt: skip
    for side, f in summary.get("_first_switch_after_start", {}).items():
        lines.append(
            f"first switch after the start, {side}: {f['switch']} {f['total_s']:.3f} s = "
            f"{_num(f.get('ratio_to_steady'), 2, 'x')} its steady median {_num(f.get('steady_median_s'))} s"
        )
    lines += first_token_lines(result)
    runs = max((r.get("runs", 0) for k, r in summary.items() if not k.startswith("_")), default=0)
    lines.append(
        f"medians of {runs} steady rounds (round 0, every side's first, is left out: `first_round`); "
        "goals (issue 58): <= 0.45x raw, <= 1.2x the overlapped bus, first switch <= 1.2x steady"
    )
    lines.append("checks: " + ", ".join(f"{k} {v}" for k, v in summary.get("_checks", {}).items()))
    return "\n".join(lines)


def first_token_lines(result: dict[str, Any]) -> list[str]:
    """Per side, the first token after a switch next to the same request sent again at once (steady rounds):
    the gap is what the first forward after a wake pays (issue 58: ~0.06-0.09 s of every switch, raw vLLM's too)."""
    by_side: dict[str, tuple[list[float], list[float]]] = {}
    for s in result.get("switches", []):
        again = s.get("first_token_again_s")
        first = s.get("first_token_after_switch_s", s.get("first_token_s"))
        if again is None or first is None or s.get("round", 1) == 0:
            continue
        firsts, agains = by_side.setdefault(s.get("side", "?"), ([], []))
        firsts.append(first)
        agains.append(again)
    return [f"first token after the switch, {side}: median {_num(median(f))} s; the same request again at once "
            f"{_num(median(a))} s (n {len(f)})" for side, (f, a) in by_side.items()]  # fmt: skip


def merged(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Runs of one machine, one side each (a device call too short for both sides' starts) as one: their
    switches and starts together, the first run's bus; refused when they differ in CUDA graphs or scenario."""
    for key in ("cuda_graphs", "scenario"):
        if len({r.get(key, False) for r in results}) > 1:
            raise ValueError(f"the runs differ in {key!r}: merge only runs of one setting")
    out = dict(results[0])
    out["switches"] = [s for r in results for s in r.get("switches", [])]
    out["starts"] = [s for r in results for s in r.get("starts", [])]
    out["sides"] = sorted({side for r in results for side in r.get("sides", [])})
    return out


def main(argv: list[str]) -> int:
    out = None
    if "--out" in argv:
        i = argv.index("--out")
        out, argv = (argv[i + 1] if i + 1 < len(argv) else ""), argv[:i] + argv[i + 2 :]
        if not out:
            print("error: --out needs a file name, e.g. --out switch_time_gpu_pair-a-b.json", file=sys.stderr)
            return 2
    if not argv or {"-h", "--help"} & set(argv):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        results = [json.loads(Path(a).read_text()) for a in argv]
        result = merged(results)
    except FileNotFoundError as exc:
        print(f"error: no such result file: {exc.filename} (give the switch_time_gpu_*.json of a run)", file=sys.stderr)
        return 2
    except (ValueError, KeyError) as exc:  # not JSON, or not a switch run's JSON
        print(f"error: {exc}: give the switch_time_gpu_*.json files of one machine's runs", file=sys.stderr)
        return 2
    print(table(result))
    if out:
        kept = {**result, "summary": summarize(result), "merged_from": [Path(a).name for a in argv],
                "bus_runs": [r.get("bus") for r in results]}  # fmt: skip
        Path(out).write_text(json.dumps(kept, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
