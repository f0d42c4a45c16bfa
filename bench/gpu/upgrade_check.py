"""`vstack upgrade check` on the lent GPU at the vLLM that pyproject.toml's `gpu` extra pins (issue 56).

    bash bench/gpu/upgrade_check.sh [PROFILE ...]                   on the lent GPU (its header has the calls)
    python -m bench.gpu.upgrade_check plan [PROFILE ...]            anywhere: the overlays and commands, no engine
    python -m bench.gpu.upgrade_check record bench/results/<run>    after adopting: the checks into the ledger

The site's python3 has the pinned vLLM (bench/gpu/site.sh), so it is both sides: `vstack upgrade check VERSION`
takes a Python that already has VERSION as the candidate as it is (stack.upgrade.venv.candidate_env: no venv, no
registry). Each profile gets its own check under the suite's overlay (bench.gpu.profiles.prepare: dummy weights
of the real shape, a smaller card's memory held to its bytes), both engines started with its rendered options, the
fixed prompts at temperature 0 (no rate search: the verdict is start, options, patches and answers), and every
runtime patch's outcome in each engine process. The checks record into copies of the pin files; `record` appends
those records, with the adopted reports' paths, to patches/ledger.yaml.

A call has ~580 s: a profile starts only when its estimate (ESTIMATE_S) fits in what the budget leaves, the rest
is left for the next call, and a check that finished in an earlier call on the same warm machine is kept
(resume). Everything lands in $OUT as it happens: summary.json/.md (with the ledger record each check wrote) and
checks/<profile>/ (the gate's report, the engines' logs, the check's output). Exit 0: every profile checked and
passed; 1: one failed; 2: no GPU, or the site lacks the pinned vLLM; 3: profiles left for the next call.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gpu.device import Device  # noqa: E402

# The datacenter profiles one lent H200 serves (the x4/x8 ones need more GPUs, the RTX ones are consumer cards):
# the H200's own first, as `vstack up` there would serve it, then the 80 GB cards held to their bytes.
DEFAULT_PROFILES = ("h200-llama-3.3-70b-fp8", "a100-80gb-llama-3.1-8b", "h100-80gb-qwen2.5-32b-awq")
# Seconds one profile's check takes on an H200, from the GPU suite's first starts at 0.26.0 (bench/results/
# 2026-11-26-h200-gpu-suite-profiles: 195.8 / 122.5 / 126.7 s through `vstack up`), a repeat start at ~0.46x of
# the first (the AOT compile cache; 2026-11-27-h200-startup-time-repeats), ~40 s of vLLM imports (options,
# runtime patch probe, parse check) and two stops.
ESTIMATE_S = {"h200-llama-3.3-70b-fp8": 360, "a100-80gb-llama-3.1-8b": 245, "h100-80gb-qwen2.5-32b-awq": 255}
DEFAULT_ESTIMATE_S = 300
now = time.monotonic  # the budget's clock (a test's is faked)
H200 = Device("NVIDIA H200", 1, int(139.8 * 2**30), int(140.4 * 2**30))  # `plan` on a machine without one


@dataclass
class Step:
    profile: str
    overlay: Path
    out: Path  # the check's --out
    argv: list[str]


def pinned_gpu() -> tuple[str, str]:
    """(dist, version) pyproject's `gpu` extra and the ledger's `targets.gpu` pin (they agree, or PinError)."""
    from stack.upgrade import pins

    return pins.current_pin(pins.PinFiles.default(), "gpu")


def site_mismatch(python: str, dist: str, version: str) -> str | None:
    """Why `python` cannot be both sides of a check of dist==version (None: it can)."""
    from packaging.version import Version

    from stack.errors import StackError
    from stack.vllm.options import installed_version

    try:
        found = installed_version(python)
    except StackError as exc:
        return f"{python}: {exc.message.splitlines()[0]}"
    # As the check itself decides (stack.upgrade.venv._same_version): a local build tag (+cu130) is the same version.
    if found[0] != dist or Version(found[1].split("+")[0]) != Version(version):
        return (
            f"{python} has {found[0]} {found[1]}, the gpu extra pins {dist}=={version}: build the site for it "
            f"(bash bench/gpu/build_site.sh --vllm {version}) and stash its parts"
        )
    return None


def pin_copies(work: Path) -> tuple[Path, Path]:
    """Copies of patches/ (the ledger and its plugins' files) and pyproject.toml the checks record into, made once
    per machine so that a resumed call adds to them; the real files are never written on the lent machine."""
    pins = work / "pins"
    if not (pins / "patches" / "ledger.yaml").is_file():
        shutil.copytree(ROOT / "patches", pins / "patches", dirs_exist_ok=True)
        shutil.copy(ROOT / "pyproject.toml", pins / "pyproject.toml")
    return pins / "patches" / "ledger.yaml", pins / "pyproject.toml"


def steps(cfg: Any, profiles: list[str], device: Device, work: Path, version: str, prompts: int) -> list[Step]:
    """Each profile's overlay (the GPU suite's) and its `vstack upgrade check` command."""
    from bench.gpu.profiles import prepare

    ledger, pyproject = pin_copies(work)
    out = []
    for profile in profiles:
        run = prepare(cfg, profile, device, work)
        folder = work / "checks" / profile
        argv = [
            sys.executable,
            "-m",
            "stack.entrypoints.cli",
            "--config",
            str(run.overlay),
            "upgrade",
            "check",
            version,
            "--profiles",
            profile,
            "--no-goodput",
            "--prompts",
            str(prompts),
            "--out",
            str(folder),
            "--ledger",
            str(ledger),
            "--pyproject",
            str(pyproject),
        ]
        out.append(Step(profile, run.overlay, folder, argv))
    return out


def chosen_profiles(cfg: Any, asked: list[str], device: Device) -> tuple[list[str], list[str]]:
    """(to check, why others are not): unknown or non-GPU names are refused, a profile this machine cannot hold
    is said and left out (as the GPU suite does)."""
    from bench.gpu.suite import _fits_card, _gpus_needed

    names = asked or list(DEFAULT_PROFILES)
    unknown = [n for n in names if n not in cfg.profiles or cfg.hardware[cfg.profiles[n].hardware].accelerator != "gpu"]
    if unknown:
        gpu = sorted(n for n, p in cfg.profiles.items() if cfg.hardware[p.hardware].accelerator == "gpu")
        raise SystemExit(f"not a GPU profile of the config: {', '.join(unknown)} (known: {', '.join(gpu)})")
    keep, notes = [], []
    for name in names:
        needs = _gpus_needed(cfg, "profile", name)
        if needs > device.count:
            notes.append(f"{name}: needs {needs} GPUs, {device.count} here (run it on nvidia-h200-x{needs})")
        elif not _fits_card(cfg, name, device):
            notes.append(f"{name}: its card has more memory than this {device.name}")
        else:
            keep.append(name)
    return keep, notes


def finished(step: Step) -> dict[str, Any] | None:
    """The report of a check that ran to its verdict (an earlier call's, on this warm machine), else None."""
    try:
        report = json.loads((step.out / "upgrade-check.json").read_text())
    except (OSError, ValueError):
        return None
    return report if isinstance(report.get("verdict"), dict) else None


def profile_summary(profile: str, report: dict[str, Any]) -> dict[str, Any]:
    """One profile's lines of the summary: the gate's verdict and each runtime patch's outcome on both sides."""
    from stack.upgrade.triage import outcomes_by_patch

    p = report["profiles"][0]
    runtime = p.get("runtime_patches") or {}
    return {
        "profile": profile,
        "status": "checked",
        "passed": p["verdict"]["passed"],
        "reasons": [f"{r['kind']}: {r['text']}" for r in p["verdict"]["reasons"]],
        "warnings": p["verdict"]["warnings"],
        "startup_s": {s: p[s]["startup_s"] for s in ("pinned", "candidate")},
        "kv_tokens": {s: p[s]["kv_tokens_vllm"] for s in ("pinned", "candidate")},
        "kv_tokens_planner": p["candidate"]["kv_tokens_planner"],
        "answers": {k: (p["answers"] or {}).get(k) for k in ("matched", "prompts", "by_kind")},
        "runtime_patches": {s: outcomes_by_patch(runtime.get(s) or []) for s in ("pinned", "candidate")},
        "runtime_probe": report["patches"].get("runtime") or {},
        "source_patches": {f["id"]: f["state"] for f in report["patches"]["patches"] if f["kind"] == "source"},
        "seconds": report["seconds"],
        "report": f"checks/{profile}/upgrade-check.json",
    }


def summarize(
    device: Device,
    dist: str,
    version: str,
    python: str,
    rows: list[dict[str, Any]],
    notes: list[str],
    records: list[dict[str, Any]],
) -> dict[str, Any]:
    checked = [r for r in rows if r["status"] == "checked"]
    return {
        "kind": "gpu-upgrade-check",
        "device": device.label,
        "gpu": device.name,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M"),
        "vllm": f"{dist} {version}",
        "pinned_extra": f"{dist}=={version}",
        "both_sides": python,
        "profiles": rows,
        "not_run": notes,
        "complete": bool(rows) and len(checked) == len(rows),
        "passed": bool(checked) and len(checked) == len(rows) and all(r["passed"] for r in checked),
        "records": records,
    }


def to_markdown(s: dict[str, Any]) -> str:
    verdict = "PASS" if s["passed"] else "FAIL" if s["complete"] else "INCOMPLETE"
    lines = [
        f"# `vstack upgrade check {s['vllm'].split()[-1]}` on {s['gpu']}: {verdict}",
        "",
        f"{s['vllm']} (the `gpu` extra pins {s['pinned_extra']}) as both the pinned side and the candidate: "
        f"`{s['both_sides']}` (the GPU site). Dummy weights of each model's real shape, {s['date']} UTC.",
        "",
        "| profile | verdict | start pinned / candidate (s) | answers identical | KV vLLM / planner |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in s["profiles"]:
        if r["status"] != "checked":
            lines.append(f"| {r['profile']} | {r['status']} | | | |")
            continue
        a = r["answers"]
        lines.append(
            f"| {r['profile']} | {'pass' if r['passed'] else 'FAIL'} | {r['startup_s']['pinned']} / "
            f"{r['startup_s']['candidate']} | {a['matched']} of {a['prompts']} ({a['by_kind']}) | "
            f"{r['kv_tokens']['candidate']} / {r['kv_tokens_planner']} |"
        )
    for r in s["profiles"]:
        if r["status"] != "checked":
            continue
        lines += [
            "",
            f"## {r['profile']}",
            "",
            *[f"- reason: {x}" for x in r["reasons"]],
            *[f"- warning: {x}" for x in r["warnings"]],
            "",
            "| runtime patch | pinned engine | candidate engine | candidate's Python (probe) |",
            "| --- | --- | --- | --- |",
        ]
        ids = dict.fromkeys([*r["runtime_patches"]["pinned"], *r["runtime_patches"]["candidate"], *r["runtime_probe"]])
        lines += [
            f"| {i} | {r['runtime_patches']['pinned'].get(i, '–')} | "
            f"{r['runtime_patches']['candidate'].get(i, '–')} | {r['runtime_probe'].get(i, '–')} |"
            for i in ids
        ]
        lines += ["", "Source patches: " + ", ".join(f"{k} {v}" for k, v in r["source_patches"].items())]
    lines += ["", *[f"- not run: {n}" for n in s["not_run"]]]
    return "\n".join(lines) + "\n"


def new_records(ledger: Path, before: int) -> list[dict[str, Any]]:
    from stack.patches.ledger import load_ledger

    return [r.model_dump(mode="json", exclude_defaults=True) for r in load_ledger(ledger).ledger.upgrades[before:]]


def stream(argv: list[str], log: Path, timeout: float) -> int:
    """Run the check, its output to this call's log (tee'd to $OUT by the shell script) and to `log`; past
    `timeout` it gets SIGTERM, on which it stops its engines and says so (sigterm_as_interrupt)."""
    with (
        log.open("w") as f,
        subprocess.Popen(
            argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        ) as proc,
    ):
        timer = threading.Timer(max(timeout, 1), lambda: os.killpg(proc.pid, signal.SIGTERM))
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                print(line, end="", flush=True)
                f.write(line)
        finally:
            timer.cancel()
        return proc.wait()


def copy_out(step: Step, out: Path) -> None:
    """The check's folder into $OUT: the report whole, each engine log's head (its runtime patch lines) and tail."""
    dest = out / "checks" / step.profile
    dest.mkdir(parents=True, exist_ok=True)
    for path in step.out.rglob("*"):
        if not path.is_file():
            continue
        target = dest / path.relative_to(step.out)
        target.parent.mkdir(parents=True, exist_ok=True)
        data = path.read_bytes()
        if len(data) > 1_500_000:  # vLLM at DEBUG: keep its start and its end
            data = data[:500_000] + b"\n[... cut by bench/gpu/upgrade_check.py ...]\n" + data[-1_000_000:]
        target.write_bytes(data)


def run(args: argparse.Namespace) -> int:
    from bench.gpu.device import detect
    from stack.config import load_config
    from stack.patches.ledger import load_ledger

    t0 = now()
    device = detect() if not args.plan else H200
    if not device.count:
        print("no NVIDIA GPU here (NVML found none): this runs on the lent machine (bash bench/gpu/upgrade_check.sh)")
        return 2
    dist, version = pinned_gpu()
    mismatch = site_mismatch(sys.executable, dist, version)
    if mismatch and not args.plan:
        print(mismatch)
        return 2
    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config()
    profiles, notes = chosen_profiles(cfg, args.profiles, device)
    plan = steps(cfg, profiles, device, work, version, args.prompts)
    if args.plan:
        print(f"{dist} {version} pinned; this Python: {mismatch or 'has it'}")
        for step in plan:
            print(f"{step.profile} (~{ESTIMATE_S.get(step.profile, DEFAULT_ESTIMATE_S)} s): {' '.join(step.argv)}")
        print(*notes, sep="\n")
        return 0
    ledger, _ = pin_copies(work)
    records_file = work / "records.json"
    records = json.loads(records_file.read_text()) if records_file.is_file() else []
    rows: list[dict[str, Any]] = []

    def save() -> None:
        summary = summarize(
            device,
            dist,
            version,
            sys.executable,
            rows + [{"profile": s.profile, "status": "not reached"} for s in plan[len(rows) :]],
            notes,
            records,
        )
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        (out / "summary.md").write_text(to_markdown(summary))

    for step in plan:
        done = finished(step)
        left = args.budget - (now() - t0)
        need = ESTIMATE_S.get(step.profile, DEFAULT_ESTIMATE_S)
        if done is None and left < need:
            print(f"== {step.profile}: ~{need} s, {left:.0f} s of the budget left: for the next call", flush=True)
            rows.append({"profile": step.profile, "status": f"left for the next call (~{need} s)"})
            save()
            continue
        if done is None:
            print(
                f"== {step.profile}: upgrade check {version} -> {version} at {time.strftime('%H:%M:%S')} "
                f"(~{need} s, {left:.0f} s left)",
                flush=True,
            )
            before = len(load_ledger(ledger).ledger.upgrades)
            step.out.mkdir(parents=True, exist_ok=True)
            code = stream(step.argv, step.out / "check.log", left - 5)
            fresh = new_records(ledger, before)  # the record `vstack upgrade check` wrote, its report as adopted
            for r in fresh:
                r["report"] = f"checks/{step.profile}/upgrade-check.json"
            records += fresh
            records_file.write_text(json.dumps(records, indent=1))
            done = finished(step)
            print(f"== {step.profile}: exit {code}", flush=True)
        else:
            print(f"== {step.profile}: checked in an earlier call (kept)", flush=True)
        copy_out(step, out)
        rows.append(
            profile_summary(step.profile, done)
            if done
            else {"profile": step.profile, "status": "no report (see check log)"}
        )
        save()
    save()
    print((out / "summary.md").read_text())
    summary = json.loads((out / "summary.json").read_text())
    return 0 if summary["passed"] else 3 if not summary["complete"] else 1


def record(args: argparse.Namespace) -> int:
    """The adopted run's check records into patches/ledger.yaml, each report as its path in the repository."""
    from stack.patches.ledger import UpgradeRecord
    from stack.upgrade import pins

    folder = Path(args.run).resolve()
    summary = json.loads((folder / "summary.json").read_text())
    files = pins.PinFiles.default()
    for item in summary["records"]:
        report = folder / item["report"]
        if not report.is_file():
            raise SystemExit(f"{report}: not there; adopt the call's checks/ folder with its summary.json")
        where = report.relative_to(ROOT) if report.is_relative_to(ROOT) else report
        rec = UpgradeRecord.model_validate({**item, "report": str(where)})
        pins.record(files, rec)
        print(
            f"recorded: {rec.action} {rec.dist} {rec.version} on {rec.device}: "
            f"{'passed' if rec.passed else 'failed'} ({rec.report})"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.gpu.upgrade_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="action", required=True)
    for name in ("run", "plan"):
        p = sub.add_parser(
            name,
            help="run the checks (lent GPU)"
            if name == "run"
            else "print the overlays' commands for an H200, start nothing",
        )
        p.add_argument("profiles", nargs="*", help=f"default: {' '.join(DEFAULT_PROFILES)}")
        p.add_argument("--work", default=os.environ.get("VSTACK_GPU_WORK", "/tmp/vstack-upgrade-check"))
        p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "out" / "upgrade-check"))
        p.add_argument("--budget", type=float, default=540, help="seconds this call may spend on checks")
        p.add_argument("--prompts", type=int, default=8, help="the first N of the check's fixed prompts")
        p.set_defaults(plan=name == "plan")
    rec = sub.add_parser("record", help="append an adopted run's check records to patches/ledger.yaml")
    rec.add_argument("run", help="bench/results/<date>-<device>-gpu-upgrade-check")
    args = ap.parse_args(argv)
    return record(args) if args.action == "record" else run(args)


if __name__ == "__main__":
    sys.exit(main())
