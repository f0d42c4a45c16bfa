"""Tune time with and without overlapped starts, side by side: the same `vstack tune` (a grid of candidates,
capacity mode: each candidate is one engine start and one short run, so the starts dominate) once with
`--no-overlap-starts` and once with `--overlap-starts`, each into its own fresh folder, in one run.

    .venv/bin/python bench/tune_overlap.py                                   # CPU: SmolLM2, 3 candidates
    .venv/bin/python bench/tune_overlap.py --modes off --work W         # one side (a GPU call each),
    .venv/bin/python bench/tune_overlap.py --modes on --work W          # then the other: both in the table
    bash bench/gpu/tune_overlap.sh off; bash bench/gpu/tune_overlap.sh on   # the 8B shape on the lent GPU

Each side runs with its own empty vLLM cache root (VLLM_CACHE_ROOT), so both compile and inspect the model
from scratch: the second side must not reuse the first's compiled graphs. Prints, per side: the tune's wall
time, each candidate's start after its gate (`startup_s`) and the part done while the one before it was
measured (`prestart_s`); and the ratio on/off. On a 2-core CPU the held engine's imports compete with the
measured engine for the cores (the tune's default there is off); on a GPU host the engine's work is on the
device. Writes WORK/tune_overlap.json and, once both sides are measured, a run folder under bench/results.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.manifest import Figure  # noqa: E402
from bench.harness.results import record  # noqa: E402
from stack.load.provenance import describe, machine_facts  # noqa: E402

SCENARIO = """\
name: overlap-bench
description: "one short capacity run per candidate (bench/tune_overlap.py): the starts dominate"
load: {users: 4, ramp_s: 0, duration_s: 10}
requests:
  stream: 1.0
  prompt_tokens: {dist: uniform, min: 64, max: 128}
  output_tokens: 32
slo: ["error_rate<0.5"]
tune: {num_prompts: 64}
"""


def run_side(mode: str, args: argparse.Namespace, work: Path) -> dict:
    out = work / f"tune-{mode}"
    scenario = work / "overlap-bench.yaml"
    scenario.write_text(SCENARIO)
    cmd = [sys.executable, "-m", "stack.entrypoints.cli", *(["--config", args.config] if args.config else []),
           "tune", *([args.target] if args.target else []), "--scenario", str(scenario), "--mode", "capacity",
           "--no-baseline", "--set", args.set, "--out", str(out), "--restart",
           "--overlap-starts" if mode == "on" else "--no-overlap-starts"]
    # Each side compiles from scratch (its own vLLM cache root): the second must not reuse the first's graphs.
    cache = work / f"vllm-cache-{mode}"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "VLLM_CACHE_ROOT": str(cache),
           **({"VSTACK_ENGINE__ENFORCE_EAGER": "true"} if args.eager else {})}
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout, check=False)
    wall = time.monotonic() - started
    (work / f"tune-{mode}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode not in (0, 11):  # 11: SLO not met, still measured
        raise SystemExit(f"{mode}: vstack tune exited {proc.returncode}; see {work / f'tune-{mode}.log'}")
    state = json.loads((out / "tune-state.json").read_text())["results"]
    rows = [{"candidate": v["label"], "startup_s": (v.get("metrics") or {}).get("startup_s"),
             "prestart_s": (v.get("metrics") or {}).get("prestart_s"), "error": v.get("error")}
            for v in state.values()]
    return {"mode": mode, "wall_s": round(wall, 1), "command": " ".join(cmd[1:]), "candidates": rows}


def report(sides: dict[str, dict]) -> None:
    for side in sides.values():
        print(f"\n{side['mode']:>3}: {side['wall_s']:.0f} s")
        for r in side["candidates"]:
            held = "" if r["prestart_s"] is None else f", held/importing {r['prestart_s']:.0f} s before"
            failed = f" FAILED {r['error']}" if r["error"] else ""
            print(f"     {r['candidate']}: start {r['startup_s']} s{held}{failed}")
    if {"on", "off"} <= sides.keys():
        ratio = sides["on"]["wall_s"] / sides["off"]["wall_s"]
        print(f"\ntune wall time, overlapped / sequential starts: {ratio:.2f}x "
              f"({sides['on']['wall_s']:.0f} s vs {sides['off']['wall_s']:.0f} s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None, help="profile or model (default: the config's serve)")
    ap.add_argument("--config", default=None, help="config overlay (the GPU scripts' dummy-weight one)")
    ap.add_argument("--set", default="max_num_seqs=4,8,16", help="the candidate grid, as `vstack tune --set`")
    ap.add_argument("--modes", default="off,on", help="off, on, or both in that order")
    ap.add_argument("--work", type=Path, default=None, help="folder for both sides (kept between calls)")
    ap.add_argument("--eager", action="store_true", help="engines with --enforce-eager (CPU: no compile)")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="vstack-tune-overlap-"))
    work.mkdir(parents=True, exist_ok=True)
    result_file = work / "tune_overlap.json"
    saved = json.loads(result_file.read_text()) if result_file.is_file() else {}
    sides: dict[str, dict] = saved.get("sides", {})  # a side measured by an earlier call into WORK
    for mode in args.modes.split(","):
        if mode not in ("on", "off"):
            raise SystemExit(f"--modes {args.modes}: each must be on or off")
        print(f"tune with overlapped starts {mode} ...", flush=True)
        sides[mode] = run_side(mode, args, work)
        result_file.write_text(json.dumps({"benchmark": "tune_overlap", "machine": machine_facts(),
                                           "sides": sides}, indent=2))
    print(f"machine: {describe(machine_facts())}")
    report(sides)
    print(f"\nresults: {result_file}")
    if {"on", "off"} <= sides.keys():  # both sides measured (possibly over several calls): one run
        off, on = sides["off"]["wall_s"], sides["on"]["wall_s"]
        folder = record("tune-overlap", f"tune with overlapped starts: {on:.0f} s vs {off:.0f} s one after "
                        f"another ({on / off:.2f}x)", figures(sides), files=[result_file])
        print(f"recorded in {folder}")
    return 0


def figures(sides: dict[str, dict]) -> list[Figure]:
    """What the manifest and docs/performance.md show of a run."""
    off, on = sides["off"]["wall_s"], sides["on"]["wall_s"]
    return [Figure(name="tune, starts one after another", value=off, unit="s",
                   meaning="wall time of the same tune with overlapped starts off"),
            Figure(name="tune, overlapped starts", value=on, unit="s",
                   meaning="wall time with the next candidate's start overlapped; lower is better"),
            Figure(name="overlapped / sequential", value=round(on / off, 3), unit="x",
                   meaning="below 1: overlapping saves time")]


if __name__ == "__main__":
    raise SystemExit(main())
