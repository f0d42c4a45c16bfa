"""`vstack tune` next to vLLM's auto_tune (port), and the 70B rows against ADR-003, from one run's folder.

    python3 bench/gpu/tune_compare.py FOLDER        (FOLDER: /tmp/vstack-gpu-tune on the device, or $OUT)

Reads FOLDER/tune-*/tune.json (ours) and FOLDER/auto-tune-*/result.txt (the port's); prints markdown:
goodput (req/s at which the SLO held), output tok/s there, per GPU, and the wall time each tuner spent.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ADR003_PER_GPU = 12_000 / 8  # output tok/s per A100, ADR-003
# The reference the field uses for a prefill-heavy shape: the GPU's dense tensor peak (vendor datasheets, no
# sparsity) over 2 FLOPs per parameter per token. Llama-3.3-70B's parameter count from its config.json shape.
PEAK_DENSE_TFLOPS = {"A100 bf16": 312, "H100/H200 bf16": 989, "H100/H200 fp8": 1979}
LLAMA_70B_PARAMS = 70.55e9


def compute_ceiling(params: float, prompt: float, output: float) -> list[str]:
    """Requests and output tokens per second per GPU at 100% of each peak, for this request shape."""
    lines = []
    for gpu, tflops in PEAK_DENSE_TFLOPS.items():
        rps = tflops * 1e12 / (2 * params * (prompt + output))
        lines.append(f"- {gpu} ({tflops:,} TFLOPS): {rps:.2f} req/s, {rps * output:,.0f} output tok/s per GPU")
    return lines


def ours(path: Path) -> dict:
    data = json.loads(path.read_text())
    rows, served = [], []
    for c in data["candidates"]:
        m = c.get("metrics") or {}
        tp = re.search(r"--tensor-parallel-size (\d+)", m.get("command") or "")  # GPUs the engine used
        rows.append((c["label"], m.get("goodput_rps"), m.get("goodput_output_tokens_per_s"), m.get("p95_ttft_ms"),
                     c.get("error"), int(tp.group(1)) if tp else 1))
        served.append((c["label"], m.get("requests_per_s") if m.get("goodput_rps") else None, m.get("tune_elapsed_s")))
    shape = next((c["metrics"] for c in data["candidates"] if c.get("metrics")), {})  # the request shape measured
    return {"name": path.parent.name, "winner": data["choice"]["winner"], "meets": data["choice"]["meets_slo"],
            "rows": rows, "served": served, "spent_s": data.get("spent_s"), "complete": data.get("complete"),
            "machine": data["machine"], "slo": data["slo"]["clauses"],
            "prompt": shape.get("prompt_tokens_mean"), "output": shape.get("output_tokens_mean")}  # fmt: skip


def theirs(path: Path) -> dict:
    text = path.read_text()
    rows = [dict((k, v.strip()) for k, v in re.findall(r"(\w+): ([^,]+)", line))
            for line in text.splitlines() if line.startswith("max_num_seqs:") and "request_rate:" in line]
    # What each measurement took, once: the "best" lines each call repeats are not counted again.
    seconds = sum(int(s) for line in text.splitlines() if line.startswith(("max_num_seqs:", "gpu_memory_utilization:"))
                  for s in re.findall(r"seconds: (\d+)", line))
    best = max(rows, key=lambda r: float(r["throughput"]), default=None)
    return {"name": path.parent.name, "rows": rows, "best": best, "seconds": seconds,
            "missed": len(re.findall(r"does not meet", text)), "header": text.splitlines()[0] if text else ""}


def fmt(x: object, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}" if isinstance(x, int | float) else str(x)


def rejudge(path: Path, keep_pace: float = 0.85) -> None:
    """The probes a tune recorded, judged again with the keep-pace rule (stack.tune.rate_search): the highest
    offered rate at which every measurement met the SLO and the engine served >= keep_pace of the offer. For
    runs recorded before the rule: what they measured, not what a search under it would have probed."""
    data = json.loads(path.read_text())
    print(f"### {path.parent.name}: recorded probes judged with keep_pace {keep_pace}\n")
    print("| candidate | highest sustained rate req/s | served there req/s | p95 TTFT ms | p95 TPOT ms "
          "| recorded goodput |")
    print("| --- | --- | --- | --- | --- | --- |")
    for c in data["candidates"]:
        by_rate: dict[float, list[dict]] = {}
        for p in c.get("points") or []:
            if p.get("rate") is not None:
                by_rate.setdefault(float(p["rate"]), []).append(p)
        held = [r for r, ps in by_rate.items() if all(
            p["met"] and (p["metrics"].get("requests_per_s") or 0) >= keep_pace * r for p in ps)]
        best = max(held, default=None)
        last = by_rate[best][-1]["metrics"] if best is not None else {}
        print(f"| {c['label']} | {fmt(best, 1)} | {fmt(last.get('requests_per_s'), 2)} | "
              f"{fmt(last.get('p95_ttft_ms'), 0)} | {fmt(last.get('p95_tpot_ms'), 1)} | "
              f"{fmt((c.get('metrics') or {}).get('goodput_rps'), 2)} |")
    print()


def side_by_side(o: dict, t: dict) -> None:
    """Both tuners on their common measure: requests/s served where the latency limit held (auto_tune's
    "throughput"), and when each had its answer; ours per candidate, in the tune's time over every call."""
    best = t["best"]
    print(f"### side by side: {o['name']} and {t['name']}\n")
    if best is None:
        print("auto_tune found no combination within the limit\n")
        return
    theirs_rps = float(best["throughput"])
    print(f"auto_tune: best {best['max_num_seqs']} x {best['max_num_batched_tokens']}, {theirs_rps:.2f} req/s served, "
          f"after {t['seconds']} s\n")
    print("| our candidate | served req/s at its goodput | vs auto_tune's best | our tune's time when it was in (s) |")
    print("| --- | --- | --- | --- |")
    first = None
    for label, rps, at in o["served"]:
        print(f"| {label} | {fmt(rps, 2)} | {f'{rps / theirs_rps:.2f}x' if rps else '-'} | {fmt(at, 0)} |")
        if rps and rps >= theirs_rps and at is not None and (first is None or at < first[1]):
            first = (label, at)
    top = max((r for r in o["served"] if r[1]), key=lambda r: r[1], default=None)
    if top:
        print(f"\nours: best {top[0]}, {top[1]:.2f} req/s served ({top[1] / theirs_rps:.2f}x auto_tune's), in "
              f"{fmt(o['spent_s'], 0)} s for {len(o['served'])} candidates vs auto_tune's {t['seconds']} s for "
              f"{len(t['rows'])} combinations")
    if first:
        print(f"ours first served at least auto_tune's best with {first[0]}, {first[1]:,.0f} s into the tune")
    print()


def main(folder: Path) -> int:
    for path in sorted(folder.glob("tune-*/tune.json")):
        o = ours(path)
        print(f"## vstack tune: {o['name']} ({', '.join(o['machine'].get('gpus') or [])}, {o['machine'].get('vllm')}, "
              f"{o['machine'].get('date')}); SLO {', '.join(o['slo'])}")
        print(f"\nwinner: **{o['winner']}** (meets the SLO: {o['meets']}); {fmt(o['spent_s'], 0)} s over every call"
              + ("" if o["complete"] else " (NOT finished)") + "\n")
        print("| candidate | goodput req/s | output tok/s there | GPUs | per GPU | vs ADR-003 1,500/GPU | p95 TTFT ms "
              "| error |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for label, rps, tps, ttft, err, gpus in o["rows"]:
            per = tps / gpus if tps else None
            ratio = f"{per / ADR003_PER_GPU:.2f}x" if per else "-"
            cells = [label, fmt(rps, 2), fmt(tps), str(gpus), fmt(per), ratio, fmt(ttft, 0), err or ""]
            print("| " + " | ".join(cells) + " |")
        print()
        if "70b" in o["name"] and o["prompt"] and o["output"]:
            flops = 2 * LLAMA_70B_PARAMS / 1e9
            print(f"Compute ceiling of this shape ({o['prompt']:,.0f} in / {o['output']:,.0f} out, {flops:.0f} GFLOPs "
                  "a token), at 100% of the dense peak:\n")
            print("\n".join(compute_ceiling(LLAMA_70B_PARAMS, o["prompt"], o["output"])) + "\n")
    for path in sorted(folder.glob("tune-*/tune.json")):
        rejudge(path)
    for path in sorted(folder.glob("auto-tune-*/result.txt")):
        t = theirs(path)
        print(f"## vLLM auto_tune (port): {t['name']}\n\n{t['header']}\n")
        print("| max_num_seqs | max_num_batched_tokens | request rate held | goodput req/s | throughput req/s | "
              "output tok/s | s |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in t["rows"]:
            print(f"| {r['max_num_seqs']} | {r['max_num_batched_tokens']} | {r['request_rate']} | {r.get('goodput')} | "
                  f"{r['throughput']} | {r.get('output_tok_s')} | {r.get('seconds')} |")
        best = t["best"]
        print(f"\nbest: {best['max_num_seqs']} x {best['max_num_batched_tokens']}, {best['throughput']} req/s"
              if best else "\nbest: none met the limit")
        print(f"{t['missed']} combination(s) missed the limit; {t['seconds']} s in all (gpu_memory_utilization search "
              "included)\n")
        mine = folder / t["name"].replace("auto-tune-", "tune-") / "tune.json"
        if mine.is_file():
            side_by_side(ours(mine), t)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/vstack-gpu-tune")))
