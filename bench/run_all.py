"""Every benchmark by one command: gateway overhead, switch time, startup time, load. JSON out, and a
markdown table with the machine and the date.

    .venv/bin/python bench/run_all.py            # full settings (about 15 minutes on a 2-core CPU machine)
    .venv/bin/python bench/run_all.py --quick    # shorter runs, eager engines (about 6 minutes)
    .venv/bin/python bench/run_all.py --only startup,load

Each benchmark is its own script (bench/gateway_overhead.py, bench/switch_time.py, bench/startup_time.py,
`vstack bench load`), run here as a child process with a time limit; one that is missing or fails is
recorded as such and the others still run. Results: results/<name>.json each, results/benchmarks.json and
results/benchmarks.md together, all copied into bench/results/<date>-<device>-run-all/ with its manifest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PY = sys.executable
RESULTS = ROOT / "results"  # the parts' work folder (ignored by git); the run is recorded under bench/results

from bench.harness.manifest import Figure  # noqa: E402
from bench.harness.results import record  # noqa: E402


def _run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env or os.environ.copy(), capture_output=True, text=True,
                              timeout=timeout, check=False)
        return proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        return 124, f"timed out after {timeout:.0f} s\n{exc.stdout or ''}"


def _script(name: str, out: Path, args: list[str], timeout: float) -> dict[str, Any]:
    """A bench/ script of another part of the project: --out is passed only when the script takes it."""
    path = ROOT / "bench" / name
    if not path.is_file():
        return {"status": "skipped", "why": f"bench/{name} is not in this checkout"}
    _code, help_text = _run([PY, str(path), "--help"], 60)
    cmd = [PY, str(path), *args, *(["--out", str(out)] if "--out" in help_text else [])]
    code, output = _run(cmd, timeout)
    return {"status": "ok" if code == 0 else "failed", "exit": code, "command": " ".join(cmd[1:]),
            "output_tail": output[-1500:]}


def gateway(quick: bool, out: Path) -> dict[str, Any]:
    args = ["--rounds", "1", "--requests", "60", "--throughput-seconds", "4"] if quick else []
    result = _script("gateway_overhead.py", out, args, 900)
    data = _load(out)
    if data:
        c1 = next((row for row in data.get("latency", []) if row.get("concurrency") == 1), {})
        tp = data.get("throughput", {})
        result["headline"] = (f"+{c1.get('vstack_added_p50_ms', float('nan')):.1f} ms p50 added at concurrency 1 "
                              f"(LiteLLM proxy +{c1.get('litellm_added_p50_ms', float('nan')):.1f} ms); "
                              f"{tp.get('vstack', 0):,.0f} req/s max vs LiteLLM {tp.get('litellm', 0):,.0f} "
                              f"({tp.get('vstack_over_litellm', 0):.1f}x)")
    return result


def switch(quick: bool, out: Path) -> dict[str, Any]:
    """bench/switch_time.py with the default model as both A and B (served under two names)."""
    from stack.config import load_config
    from stack.models import find_local

    cfg = load_config()
    files = find_local(cfg.models[cfg.default_model], cfg)
    if files is None:
        return {"status": "skipped", "why": f"{cfg.default_model} is not here (vstack models pull {cfg.default_model})"}
    model = str(files.path)
    result = _script("switch_time.py", out, ["--model-a", model, "--model-b", model,
                                             "--repeat", "1" if quick else "3"], 1500)
    data = _load(out)
    if data and data.get("rows"):
        result["headline"] = "; ".join(f"{r['kind']}: vstack {r['vstack_s']:.2f} s vs plain vLLM "
                                       f"{r['plain_vllm_s']:.2f} s ({r['ratio']:.2f}x)" for r in data["rows"])
    return result


def startup(quick: bool, out: Path) -> dict[str, Any]:
    result = _script("startup_time.py", out, ["--eager"] if quick else [], 1800)
    data = _load(out)
    if data:
        med = data["median_s"]
        result["headline"] = (f"vstack up {med['vstack_up']:.1f} s vs vllm serve {med['vllm_serve']:.1f} s to the "
                              f"first token ({data['ratio_vstack_to_plain']:.2f}x, {data['added_s']:+.1f} s)"
                              + (" [eager]" if data.get("eager") else ""))
    return result


def load(quick: bool, out: Path) -> dict[str, Any]:
    """The smoke scenario against the real stack (`vstack up` on a free port, stopped afterwards)."""
    state = tempfile.mkdtemp(prefix="vstack-bench-")
    env = {**os.environ, "VSTACK_STATE_DIR": state, "VSTACK_PORT": "0"}
    if quick:
        env["VSTACK_ENGINE__ENFORCE_EAGER"] = "true"
    cli = [PY, "-m", "stack.entrypoints.cli"]
    code, output = _run([*cli, "up", "--port", "0"], 1200, env)
    if code != 0:
        return {"status": "failed", "exit": code, "output_tail": output[-1500:]}
    folder = out.with_suffix("")
    try:
        code, output = _run([*cli, "bench", "load", "--scenario", "smoke", "--out", str(folder),
                             *(["--duration", "15"] if quick else ["--duration", "60"])], 600, env)
    finally:
        _run([*cli, "down", "--all"], 300, env)  # every engine stopped: nothing kept asleep (adr/0030)
    report = _load(folder / "report.json")
    result: dict[str, Any] = {"status": "ok" if report else "failed", "exit": code, "report": str(folder),
                              "output_tail": output[-1500:]}
    if report:
        out.write_text(json.dumps(report, indent=2))
        m = report["metrics"]
        result["headline"] = (f"{m['output_tokens_per_s']:.1f} output tok/s, {m['requests_per_s']:.2f} req/s, "
                              f"TTFT p50/p95 {m['p50_ttft_ms']:.0f}/{m['p95_ttft_ms']:.0f} ms, "
                              f"ITL p95 {m['p95_itl_ms']:.0f} ms, errors {m['error_rate']:.1%}, "
                              f"SLO {'pass' if report['slo']['passed'] else 'FAIL'}")
    return result


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


BENCHMARKS: dict[str, Callable[[bool, Path], dict[str, Any]]] = {
    "gateway_overhead": gateway, "switch_time": switch, "startup_time": startup, "load_smoke": load,
}
ALIASES = {"gateway": "gateway_overhead", "switch": "switch_time", "startup": "startup_time", "load": "load_smoke"}


def markdown(summary: dict[str, Any]) -> str:
    from stack.load.provenance import describe

    lines = [f"Machine: {describe(summary['machine'])}; {'quick' if summary['quick'] else 'full'} settings; "
             f"`python bench/run_all.py{' --quick' if summary['quick'] else ''}`", "",
             "| benchmark | result | status | seconds |", "| --- | --- | --- | --- |"]
    for name, r in summary["benchmarks"].items():
        shown = r.get("headline") or r.get("why") or "-"
        lines.append(f"| {name} | {shown} | {r['status']} | {r.get('seconds', '-')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs and eager engines")
    ap.add_argument("--only", default="", help="comma-separated: gateway, switch, startup, load")
    ap.add_argument("--out", type=Path, default=RESULTS / "benchmarks.json")
    args = ap.parse_args()
    from stack.load.provenance import machine_facts

    wanted = [ALIASES.get(n.strip(), n.strip()) for n in args.only.split(",") if n.strip()] or list(BENCHMARKS)
    unknown = [n for n in wanted if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; use {', '.join(ALIASES)}")
    RESULTS.mkdir(exist_ok=True)
    summary: dict[str, Any] = {"machine": machine_facts(), "quick": args.quick, "benchmarks": {}}
    earlier = _load(args.out) if args.only else None
    if earlier and earlier.get("quick") == args.quick:  # --only reruns some: keep the others' last results
        summary["benchmarks"] = earlier.get("benchmarks", {})
    for name in wanted:  # one at a time: they share 2 cores and must not disturb each other
        print(f"==> {name}", flush=True)
        started = time.monotonic()
        result = BENCHMARKS[name](args.quick, RESULTS / f"{name}.json")
        result["seconds"] = round(time.monotonic() - started)
        summary["benchmarks"][name] = result
        shown = result.get("headline") or result.get("why") or result.get("output_tail", "")[-300:]
        print(f"    {result['status']}: {shown}", flush=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(summary))
    print("\n" + markdown(summary))
    ok = [n for n, r in summary["benchmarks"].items() if r["status"] == "ok"]
    parts = [RESULTS / f"{n}.json" for n in summary["benchmarks"] if (RESULTS / f"{n}.json").is_file()]
    folder = record("run-all", f"{len(ok)} of {len(summary['benchmarks'])} CPU benchmarks ok"
                    + (" (quick)" if args.quick else ""),
                    [Figure(name="benchmarks", value=len(summary["benchmarks"]), unit="",
                            meaning="benchmarks run by bench/run_all.py"),
                     Figure(name="benchmarks ok", value=len(ok), unit="", meaning="of them, finished without error")],
                    files=[args.out, args.out.with_suffix(".md"), *parts])
    print(f"recorded in {folder}")
    return 0 if all(r["status"] != "failed" for r in summary["benchmarks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
