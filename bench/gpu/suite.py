"""The GPU suite: every shipped GPU profile served for real, the planner against vLLM on every KV layout,
sleep switching through the manager next to raw vLLM, and (when it exists) the tools/LoRA row.

    bash bench/gpu/suite.sh [--only NAME ...] [--kind profile|layout|switch|tools ...]   (on the lent GPU)
    python -m bench.gpu.suite report bench/results/2026-11-23-h200-gpu-suite/gpu-h200-2026-11-23.json  (anywhere;
                                                                                       --markdown: tables)

Rows that need more GPUs than the machine has are listed as `needs N GPUs` and not run (the TP rows run on
nvidia-h200-x2). Results go to bench/out/gpu-<device>-<date>.json (rows of an earlier run of the same
device and day are kept unless rerun) and, on the lent machine, to $OUT. README "GPU suite" has the recipe.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gpu.device import Device, detect  # noqa: E402

KV_TOLERANCE = 0.03  # the planner's KV tokens within 3% of vLLM's own
TOOLS_ROW = ROOT / "bench" / "gpu" / "rows" / "lora_tools.py"


def wanted(name: str, kind: str, only: list[str], kinds: list[str]) -> bool:
    return (not only or any(o in name for o in only)) and (not kinds or kind in kinds)


def tools_row(device: Device, work: Path, log_dir: Path) -> dict[str, Any]:
    """bench/gpu/rows/lora_tools.py's `run(device, work, log_dir) -> dict` (written with the tool-calling
    issue); `pending` until that file exists."""
    if not TOOLS_ROW.is_file():
        return {"row": "tools-lora", "kind": "tools", "status": "pending",
                "reason": "bench/gpu/rows/lora_tools.py is not there yet (tool calling and LoRA issue)"}
    spec = importlib.util.spec_from_file_location("vstack_gpu_lora_tools", TOOLS_ROW)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        row = dict(module.run(device=device, work=work, log_dir=log_dir))
    except Exception as exc:
        row = {"error": f"{type(exc).__name__}: {exc}"}
    return {"row": "tools-lora", "kind": "tools", **row}


def run(args: argparse.Namespace) -> int:
    from bench.gpu.layouts import LAYOUTS, run_layout
    from bench.gpu.profiles import gpu_profiles, run_profile
    from bench.gpu.switching import run_switching
    from stack.config import load_config
    from stack.hardware import detect as detect_hardware

    device = detect()
    if not device.count:
        print("no NVIDIA GPU here (NVML found none): the GPU suite runs on the lent machine (README, GPU suite)")
        return 2
    hardware_info = detect_hardware()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    log_dir = work / "logs"
    log_dir.mkdir(exist_ok=True)
    today = dt.date.today().isoformat()
    results_dir = Path(os.environ.get("VSTACK_GPU_RESULTS_DIR") or ROOT / "bench" / "out")
    out_path = Path(args.results or results_dir / f"gpu-{device.label}-{today}.json")
    result = json.loads(out_path.read_text()) if out_path.is_file() else {"rows": []}
    vllm_version = _vllm_version()
    result.update(device=device.name, label=device.label, gpus=device.count, date=today, vllm=vllm_version,
                  cuda_total_gib=round(device.cuda_total / 2**30, 2),
                  nvml_total_gib=round(device.nvml_total / 2**30, 2), driver=device.driver)
    cfg = load_config()
    plan: list[tuple[str, str, Any]] = []
    for profile in gpu_profiles(cfg):
        plan.append((profile, "profile", profile))
    for layout in LAYOUTS:
        plan.append((layout.name, "layout", layout))
    plan.append(("sleep-switch", "switch", None))
    plan.append(("tools-lora", "tools", None))

    def save(row: dict[str, Any]) -> None:
        row["device"] = device.label
        row["finished"] = time.strftime("%H:%M:%S")
        result["rows"] = [r for r in result["rows"] if r.get("row") != row["row"]] + [row]
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1))
        if os.environ.get("OUT"):
            shutil.copy(out_path, Path(os.environ["OUT"]) / out_path.name)
        print(f"== {row['row']}: {verdict(row)}", flush=True)

    for name, kind, item in plan:
        if not wanted(name, kind, args.only, args.kind):
            continue
        needs = _gpus_needed(cfg, kind, item)
        if needs > device.count:
            print(f"== {name}: needs {needs} GPUs, {device.count} here (run it on nvidia-h200-x{needs})", flush=True)
            continue
        if kind == "profile" and not _fits_card(cfg, item, device):
            print(f"== {name}: its card has more memory than this {device.name}; run it on an H200", flush=True)
            continue
        print(f"== {name} ({kind}) starting at {time.strftime('%H:%M:%S')}", flush=True)
        if kind == "profile":
            save(run_profile(cfg, item, device, work, log_dir))
        elif kind == "layout":
            save(run_layout(item, work, log_dir, hardware_info))
        elif kind == "switch":
            save(run_switching(cfg, device, work, log_dir))
        else:
            save(tools_row(device, work, log_dir))
    print(table(result))
    print(f"results: {out_path}")
    return 0 if all(verdict(r) in ("ok", "pending") for r in result["rows"] if r.get("device") == device.label) else 1


def _vllm_version() -> str:
    try:
        from importlib.metadata import version

        return version("vllm")
    except Exception:
        return "unknown"


def _gpus_needed(cfg: Any, kind: str, item: Any) -> int:
    if kind == "layout":
        return item.gpus
    if kind == "profile":
        count = cfg.hardware[cfg.profiles[item].hardware].gpu_count
        return min(count, 2)  # an 8-GPU profile runs scaled to tensor parallel 2 (nvidia-h200-x2)
    return 1


def _fits_card(cfg: Any, profile: str, device: Device) -> bool:
    hw = cfg.hardware[cfg.profiles[profile].hardware]
    card = hw.planner.usable_memory_gib or (hw.memory_gib or 0) * 0.985
    return card <= device.cuda_total / 2**30 + 0.5  # an H100 profile on an H100 whose CUDA total is a bit less


def verdict(row: dict[str, Any]) -> str:
    """ok, pending, or what failed."""
    if row.get("status") == "pending":
        return "pending"
    bad = []
    if row.get("error"):
        bad.append("error")
    kind = row.get("kind")
    if kind in ("profile", "layout"):
        err = row.get("kv_error")
        if err is None or abs(err) > KV_TOLERANCE:
            bad.append(f"KV {err:+.1%}" if err is not None else "KV not compared")
    if kind == "profile":
        labels = {"chat_ok": "chat", "json_ok": "json_schema", "tools_ok": "tools", "metrics_ok": "metrics",
                  "stopped_clean": "stop"}
        bad += [f"{label} failed" for key, label in labels.items() if not row.get(key)]
    if kind == "switch" and not row.get("ok"):
        bad.append("switch failed")
    if kind == "tools" and not row.get("ok"):
        bad.append("tools failed")
    return "ok" if not bad else "FAILED: " + ", ".join(bad)


def _pct(row: dict[str, Any]) -> str:
    err, now = row.get("kv_error"), row.get("kv_error_now")
    text = f"{err:+.1%}" if err is not None else "-"
    if now is not None and err is not None and abs(now - err) >= 0.0005:
        text += f" (now {now:+.1%})"
    return text


def _tokens(row: dict[str, Any], side: str) -> str:
    value = (row.get(side) or {}).get("kv_tokens")
    return f"{int(value):,}" if value else "-"


def table(result: dict[str, Any], markdown: bool = False) -> str:
    rows = result.get("rows", [])
    lines: list[list[str]] = []
    head = ["row", "device", "started (s)", "chat", "json_schema", "tools", "metrics", "KV planner", "KV vLLM",
            "error", "stopped clean", "note"]
    yes = {True: "OK", False: "FAIL", None: "-"}
    for r in rows:
        kind = r.get("kind")
        if kind == "profile":
            lines.append([r["row"], r.get("device", ""), str(r.get("started_s", "-")), yes[r.get("chat_ok")],
                          yes[r.get("json_ok")], yes[r.get("tools_ok")], yes[r.get("metrics_ok")],
                          _tokens(r, "planner"),
                          _tokens(r, "vllm"), _pct(r), yes[r.get("stopped_clean")],
                          r.get("held_to") or "" if "error" not in r else "error: " + r["error"][-80:]])
        elif kind == "layout":
            note = r.get("layout", "") + ("" if r.get("new_shape") else " (shape checked before)")
            lines.append([r["row"], r.get("device", ""), str(r.get("seconds", "-")), "-", "-", "-", "-",
                          _tokens(r, "planner"), _tokens(r, "vllm"), _pct(r), "-",
                          note if "error" not in r else "error: " + str(r["error"])[-80:]])
        elif kind == "switch":
            s = r.get("switch_s", {})
            note = (f"B cold {s.get('ours_cold')} s; wake+first token: vstack {s.get('ours_wake_median')} s, "
                    f"raw vLLM {s.get('raw_wake_median')} s; asleep holds {r.get('asleep_holds_gib')} GiB")
            lines.append([r["row"], r.get("device", ""), str(r.get("ours", {}).get("a_started_s", "-")),
                          "-", "-", "-", "-", "-", "-", "-", yes[r.get("ours", {}).get("stopped_clean")],
                          note if r.get("ok") else "FAILED: " + str(r.get("ours", {}).get("error", note))[-120:]])
        else:
            lines.append([r["row"], r.get("device", ""), "-", "-", "-", "-", "-", "-", "-", "-", "-",
                          r.get("status") or ("OK" if r.get("ok") else str(r.get("error", ""))[-80:])])
    lines = [[" ".join(str(c).split()) for c in line] for line in lines]
    title = f"{result.get('device')} x{result.get('gpus')}, vLLM {result.get('vllm')}, {result.get('date')}"
    if markdown:
        out = [title, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(c.replace("|", "/") for c in line) + " |" for line in lines]
        return "\n".join(out)
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head) - 1)]
    out = [title]
    for line in [head, *lines]:
        out.append("  ".join(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)) + "  " + line[-1])
    return "\n".join(out)


def repredict(path: Path) -> None:
    """Ask the planner of this checkout again for every layout row of a results file, on the GPUs it records
    (the inputs are in the file: fixture, options, device): `planner_now` and `kv_error_now` next to the
    figures of the run, which stay as measured."""
    from types import SimpleNamespace

    from bench.gpu.layouts import LAYOUTS, predict
    from bench.harness.dummy_models import fixture_config, write_model

    result = json.loads(path.read_text())
    gpu = SimpleNamespace(name=result["device"], memory_total=int(result["nvml_total_gib"] * 2**30),
                          memory_free=int(result["nvml_total_gib"] * 2**30))
    info = SimpleNamespace(gpus=[gpu] * int(result["gpus"]), ram_total=0, ram_available=0)
    layouts = {layout.name: layout for layout in LAYOUTS}
    for row in result["rows"]:
        layout = layouts.get(row["row"])
        actual = (row.get("vllm") or {}).get("kv_tokens")
        if row.get("kind") != "layout" or layout is None or not actual:
            continue
        folder = write_model(Path("/tmp/vstack-repredict") / layout.name, fixture_config(layout.fixture))
        row["planner_now"] = predict(layout, folder, info)
        row["kv_error_now"] = round(row["planner_now"]["kv_tokens"] / actual - 1, 4)
    path.write_text(json.dumps(result, indent=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode")
    r = sub.add_parser("run", help="run rows on this machine's GPUs (the default)")
    r.add_argument("--only", action="append", default=[], help="rows whose name contains this (repeatable)")
    r.add_argument("--kind", action="append", default=[], choices=["profile", "layout", "switch", "tools"])
    r.add_argument("--work", default=os.environ.get("VSTACK_GPU_WORK", "/tmp/vstack-gpu-suite"))
    r.add_argument("--results", help="results file (default bench/out/gpu-<device>-<date>.json)")
    p = sub.add_parser("report", help="print a results file as a table")
    p.add_argument("json", type=Path)
    p.add_argument("--markdown", action="store_true")
    q = sub.add_parser("repredict", help="add this checkout's planner figures to a results file's layout rows")
    q.add_argument("json", type=Path)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("run", "report", "repredict", "-h", "--help"):
        argv.insert(0, "run")
    args = ap.parse_args(argv)
    if args.mode == "repredict":
        repredict(args.json)
        return 0
    if args.mode == "report":
        result = json.loads(args.json.read_text())
        print(table(result, args.markdown))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
